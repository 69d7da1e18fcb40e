//! A credential in memory: never in a Debug string, a log line or an error,
//! and overwritten when dropped.

use zeroize::Zeroize;

pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The value, for the one place that hands it over.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("mango_st_very_secret".into());
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(s.expose(), "mango_st_very_secret");
    }
}
