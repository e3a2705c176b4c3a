//! SASL PLAIN (RFC 4616): one message, `authzid NUL user NUL password`.
//! skiff checks the password against the user's SCRAM credentials
//! ([`crate::ScramCredential::verify_password`]), so a user has one password
//! for every mechanism; PLAIN sends it in the clear and belongs on TLS
//! listeners only (SASL_SSL).

/// A PLAIN message longer than this is refused before it is parsed.
pub const MAX_MESSAGE_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainMessage {
    pub user: String,
    pub password: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlainError {
    /// Kafka's wording for a message that is not three NUL-separated parts.
    #[error("Invalid SASL/PLAIN response: expected 3 tokens, got {0}")]
    Tokens(usize),
    #[error("Authentication failed: username not specified")]
    NoUser,
    #[error("Authentication failed: password not specified")]
    NoPassword,
    #[error("Authentication failed: Client requested an authorization id that is different from username")]
    AuthzidMismatch,
    #[error("SASL/PLAIN message of {0} bytes is too long")]
    TooLong(usize),
    #[error("SASL/PLAIN message is not UTF-8")]
    NotUtf8,
}

pub fn parse(message: &[u8]) -> Result<PlainMessage, PlainError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(PlainError::TooLong(message.len()));
    }
    let text = std::str::from_utf8(message).map_err(|_| PlainError::NotUtf8)?;
    let parts: Vec<&str> = text.split('\0').collect();
    let [authzid, user, password] = parts[..] else {
        return Err(PlainError::Tokens(parts.len()));
    };
    if user.is_empty() {
        return Err(PlainError::NoUser);
    }
    if password.is_empty() {
        return Err(PlainError::NoPassword);
    }
    if !authzid.is_empty() && authzid != user {
        return Err(PlainError::AuthzidMismatch);
    }
    Ok(PlainMessage {
        user: user.to_string(),
        password: password.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_and_without_an_authorization_id() {
        let want = PlainMessage {
            user: "alice".into(),
            password: "pw".into(),
        };
        assert_eq!(parse(b"\0alice\0pw"), Ok(want.clone()));
        assert_eq!(parse(b"alice\0alice\0pw"), Ok(want));
    }

    #[test]
    fn refuses_malformed_messages_with_kafkas_reasons() {
        assert_eq!(parse(b""), Err(PlainError::Tokens(1)));
        assert_eq!(parse(b"alice\0pw"), Err(PlainError::Tokens(2)));
        assert_eq!(parse(b"\0alice\0pw\0x"), Err(PlainError::Tokens(4)));
        assert_eq!(parse(b"\0\0pw"), Err(PlainError::NoUser));
        assert_eq!(parse(b"\0alice\0"), Err(PlainError::NoPassword));
        assert_eq!(parse(b"bob\0alice\0pw"), Err(PlainError::AuthzidMismatch));
        assert_eq!(parse(b"\0al\xffice\0pw"), Err(PlainError::NotUtf8));
        let huge = vec![b'a'; MAX_MESSAGE_BYTES + 1];
        assert_eq!(
            parse(&huge),
            Err(PlainError::TooLong(MAX_MESSAGE_BYTES + 1))
        );
    }
}
