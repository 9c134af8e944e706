//! STUB — to be replaced: the fixed_window algorithm (Rust twin of lua/fixed_window.lua).
