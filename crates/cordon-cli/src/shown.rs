//! How the commands show a digest (sizes: `cordon_template::human`).

/// `sha256:` and the first 12 hex digits.
pub(crate) fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}
