//! STUB — to be replaced: the sliding_log algorithm (Rust twin of lua/sliding_log.lua).
