//! What the benchmarks share.

/// The number in the environment variable `name`, or `default` when it is unset.
pub fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: a number"))
    })
}
