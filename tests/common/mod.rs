//! Shared by the integration tests: the one table of algorithm cases every backend must pass.

pub mod cases;
