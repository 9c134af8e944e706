//! STUB — to be replaced: the sliding_window algorithm (Rust twin of lua/sliding_window.lua).
