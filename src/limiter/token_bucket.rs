//! STUB — to be replaced: the token_bucket algorithm (Rust twin of lua/token_bucket.lua).
