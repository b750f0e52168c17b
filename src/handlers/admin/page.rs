//! Keyset pagination of the admin port's lists: a page holds the items after a key
//! in key order, and its token, opaque to clients, names the key of its last item.

use crate::error::{Error, FieldViolation};
use base64::Engine as _;

/// The most items a page holds, and how many when a request does not say.
pub const MAX_PAGE: u32 = 1000;
pub const DEFAULT_PAGE: u32 = 100;

/// The pages of one list: `tag` marks its tokens (a token of another list is
/// refused), `rpc` names it in errors.
pub struct Keyset {
    pub tag: &'static str,
    pub rpc: &'static str,
}

fn invalid(field: &'static str, description: String) -> Error {
    Error::InvalidArgument(vec![FieldViolation { field, description }])
}

impl Keyset {
    /// The page size `size` asks for ([`DEFAULT_PAGE`] for 0), checked.
    pub fn limit(size: u32) -> Result<u32, Error> {
        match size {
            0 => Ok(DEFAULT_PAGE),
            n if n <= MAX_PAGE => Ok(n),
            _ => Err(invalid("page_size", format!("must be at most {MAX_PAGE}"))),
        }
    }

    /// The token of a page that ends with `key`.
    pub fn token(&self, key: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}:{key}", self.tag))
    }

    /// The key a page `token` ends with ("" for the first page), refused unless it
    /// is one of this list's and `valid` accepts it.
    pub fn after(&self, token: &str, valid: impl FnOnce(&str) -> bool) -> Result<String, Error> {
        if token.is_empty() {
            return Ok(String::new());
        }
        let bad = || invalid("page_token", format!("not a page token of {}", self.rpc));
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        let key = (text.strip_prefix(self.tag))
            .and_then(|rest| rest.strip_prefix(':'))
            .ok_or_else(bad)?;
        if !valid(key) {
            return Err(bad());
        }
        Ok(key.to_owned())
    }

    /// A page read with one item more than `limit` (whether a next page exists):
    /// at most `limit` items, and the next page's token ("" at the end).
    pub fn page<T>(
        &self,
        mut items: Vec<T>,
        limit: u32,
        key: impl Fn(&T) -> &str,
    ) -> (Vec<T>, String) {
        let limit = limit as usize;
        let more = items.len() > limit;
        items.truncate(limit);
        let next = match (more, items.last()) {
            (true, Some(last)) => self.token(key(last)),
            _ => String::new(),
        };
        (items, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USERS: Keyset = Keyset {
        tag: "u",
        rpc: "ListUsers",
    };

    #[test]
    fn page_tokens_are_opaque_and_checked() {
        let token = USERS.token("alice.b");
        assert!(!token.contains("alice"));
        assert_eq!(USERS.after(&token, |_| true).unwrap(), "alice.b");
        assert_eq!(USERS.after("", |_| false).unwrap(), "");
        let other = Keyset {
            tag: "s",
            rpc: "ListServiceAccounts",
        };
        let theirs = other.token("alice.b");
        for bad in ["!!", "eDphbGljZQ", theirs.as_str()] {
            assert!(
                matches!(USERS.after(bad, |_| true), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
        assert!(USERS.after(&token, |_| false).is_err(), "a key it refuses");
    }

    #[test]
    fn a_page_has_a_next_token_only_when_more_was_read() {
        let (items, next) = USERS.page(vec!["a", "b", "c"], 2, |s| s);
        assert_eq!(
            (items, USERS.after(&next, |_| true).unwrap()),
            (vec!["a", "b"], "b".into())
        );
        let (items, next) = USERS.page(vec!["a", "b"], 2, |s| s);
        assert_eq!((items.len(), next.as_str()), (2, ""));
        assert_eq!(Keyset::limit(0).unwrap(), DEFAULT_PAGE);
        assert!(Keyset::limit(MAX_PAGE + 1).is_err());
    }
}
