//! STUB — to be replaced: the gcra algorithm (Rust twin of lua/gcra.lua).
