//! How a command fails: one line for a person, one exit code for a script.

use super::table::first_line;
use mango_client::ClientError;

/// Exit codes (docs/operator-cli.md): 0 is success.
pub const API_ERROR: u8 = 1;
pub const USAGE: u8 = 2;
pub const NOT_FOUND: u8 = 3;
pub const UNAUTHORIZED: u8 = 4;
pub const UNREACHABLE: u8 = 5;

#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: USAGE,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Failure {
        Failure {
            code: NOT_FOUND,
            message: message.into(),
        }
    }

    pub fn other(message: impl Into<String>) -> Failure {
        Failure {
            code: API_ERROR,
            message: message.into(),
        }
    }

    /// A failed call to the api at `base`, by what went wrong.
    pub fn from_client(err: ClientError, base: &str) -> Failure {
        match err {
            ClientError::Api {
                status,
                kind,
                message,
                request_id,
                ..
            } => {
                let code = match status.as_u16() {
                    401 | 403 => UNAUTHORIZED,
                    404 => NOT_FOUND,
                    _ => API_ERROR,
                };
                let request = request_id.map_or(String::new(), |id| format!(", request {id}"));
                Failure {
                    code,
                    message: format!("{message} ({} {kind}{request})", status.as_u16()),
                }
            }
            ClientError::Transport(e) => {
                let why = if e.is_timeout() {
                    "it did not answer in time"
                } else if e.is_connect() {
                    "the connection failed"
                } else {
                    "the request failed"
                };
                Failure {
                    code: UNREACHABLE,
                    message: format!("cannot reach the Mango api at {base}: {why} (check --base-url or MANGO_BASE_URL)"),
                }
            }
            ClientError::Decode(what) => Failure::other(format!(
                "the api at {base} answered something unexpected: {what}"
            )),
        }
    }

    pub fn code(&self) -> u8 {
        self.code
    }

    /// The message as one line, with `secret` (the key) never in it, even
    /// if an answer echoed it.
    pub fn line(&self, secret: Option<&str>) -> String {
        let line = first_line(&self.message);
        match secret.filter(|s| s.len() >= 4) {
            Some(s) => line.replace(s, "[key]"),
            None => line,
        }
    }
}

/// `?` on a client call inside a command: the api's base URL goes with it.
pub trait OrFailure<T> {
    fn or_fail(self, client: &mango_client::Client) -> Result<T, Failure>;
}

impl<T> OrFailure<T> for Result<T, ClientError> {
    fn or_fail(self, client: &mango_client::Client) -> Result<T, Failure> {
        self.map_err(|e| Failure::from_client(e, client.base_url()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_line_without_the_key() {
        let f = Failure::other("bad key mango_ws_secret123\nsecond line");
        assert_eq!(f.line(Some("mango_ws_secret123")), "bad key [key]");
        assert_eq!(f.code(), API_ERROR);
    }
}
