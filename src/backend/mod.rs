//! Where counters live. `memory` is the embedded backend; Redis joins in the next step.

pub mod memory;

pub use memory::MemoryBackend;
