//! Keeps credentials out of text that ends up in errors, logs and `Debug` output.
//!
//! Text from outside this crate, a driver's error (sqlx quotes a connection string it cannot
//! parse, password included), a parser's message quoting the input, a URL from the
//! configuration, passes through here before it is put in an error or a log line:
//!
//! - [`text`] masks every credential the text visibly carries: a URL's userinfo
//!   (`postgres://user:***@host`, and `user:***@host` in a URL that lost its `://`, such as
//!   `postgres//app:***@db` or `app:***@db/app`), the value of a `key=value` pair whose key
//!   names a secret
//!   (`?token=***`, `password=***`), and what follows an HTTP auth scheme (`Bearer ***`);
//! - [`url`] shows a URL known to be a deployment address as its origin only
//!   (`https://hooks.example.com/…`), since a webhook's path or query often is its token.
//!
//! Values known to be secrets (an auth header, an HMAC key, a database URL) are held in
//! [`Secret`](crate::config::Secret) and never formatted at all; this module catches the
//! secrets that reach a message by another road.

/// What a masked credential is replaced with.
const MASK: &str = "***";

/// Keys of `key=value` pairs whose value is masked, matched as parts of the key, ignoring
/// case (`api_key`, `access_token`, `sslpassword`, `X-Amz-Signature`).
const SECRET_KEYS: [&str; 9] = [
    "pass",
    "pwd",
    "secret",
    "token",
    "key",
    "sig",
    "auth",
    "credential",
    "session",
];

/// HTTP auth schemes whose credentials follow them after a space, matched as whole words
/// ignoring case.
const AUTH_SCHEMES: [&str; 3] = ["bearer", "basic", "digest"];

/// `text` with every credential it visibly carries masked (see the module docs).
pub(crate) fn text(text: &str) -> String {
    let userinfo = mask_bare_userinfo(&mask_userinfo(text));
    mask_auth_schemes(&mask_secret_pairs(&userinfo))
}

/// A URL as it may be shown: its scheme, host and port, then `/…` if it has more (a path or
/// a query, which may be a token). Text that is no URL is masked whole.
pub(crate) fn url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return MASK.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let more = if authority_end < rest.len() || host.len() < authority.len() {
        "/…"
    } else {
        ""
    };
    format!("{scheme}://{host}{more}")
}

/// Characters that end a URL or a value in running text.
fn ends_token(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\'' | '"' | '`' | '<' | '>' | '(' | ')' | ',' | ';')
}

/// `scheme://user:password@host` → `scheme://user:***@host`; `scheme://token@host` →
/// `scheme://***@host`. The userinfo runs to the last `@` before the query, so a password
/// with an unescaped `/` or `@` in it is masked whole too.
fn mask_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("://") {
        let (before, after) = rest.split_at(start + 3);
        out.push_str(before);
        let token_end = after.find(ends_token).unwrap_or(after.len());
        let query = after[..token_end].find(['?', '#']).unwrap_or(token_end);
        match after[..query].rfind('@') {
            Some(at) => {
                let userinfo = &after[..at];
                match userinfo.split_once(':') {
                    Some((user, _)) if !user.contains('/') => {
                        out.push_str(user);
                        out.push(':');
                    }
                    _ => {}
                }
                out.push_str(MASK);
                rest = &after[at..];
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// `user:password@host` → `user:***@host` in a word with no `://` (a URL that lost it:
/// `postgres//app:pw@db`, `postgres:/app:pw@db`, `app:pw@db/app`): the password is what
/// follows the first `:` after the word's last `/` before its last `@` (before any query).
/// A word with an `@` and no such `:` (an e-mail address) is kept.
fn mask_bare_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let word_end = rest.find(ends_token).unwrap_or(rest.len());
        let (word, after) = rest.split_at(word_end);
        out.push_str(&mask_word_userinfo(word));
        let separator = after.chars().next().map_or(0, char::len_utf8);
        out.push_str(&after[..separator]);
        rest = &after[separator..];
    }
    out
}

/// One word of [`mask_bare_userinfo`].
fn mask_word_userinfo(word: &str) -> std::borrow::Cow<'_, str> {
    if word.contains("://") {
        return word.into();
    }
    let query = word.find(['?', '#']).unwrap_or(word.len());
    let Some(at) = word[..query].rfind('@') else {
        return word.into();
    };
    let userinfo_start = word[..at].rfind('/').map_or(0, |slash| slash + 1);
    let Some(colon) = word[userinfo_start..at].find(':') else {
        return word.into();
    };
    let password_start = userinfo_start + colon + 1;
    if &word[password_start..at] == MASK || password_start == at {
        return word.into();
    }
    format!("{}{MASK}{}", &word[..password_start], &word[at..]).into()
}

/// `password=hunter2` → `password=***`, for every key naming a secret (query strings,
/// connection parameters).
fn mask_secret_pairs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(equals) = rest.find('=') {
        let (before, after) = (&rest[..equals], &rest[equals + 1..]);
        out.push_str(before);
        out.push('=');
        let key_len: usize = before
            .chars()
            .rev()
            .take_while(|&c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            .map(char::len_utf8)
            .sum();
        let key = before[before.len() - key_len..].to_ascii_lowercase();
        let value_end = after
            .find(|c: char| ends_token(c) || c == '&')
            .unwrap_or(after.len());
        let secret = SECRET_KEYS.iter().any(|part| key.contains(part));
        if secret && value_end > 0 {
            out.push_str(MASK);
            rest = &after[value_end..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `Bearer abc` → `Bearer ***`, for the schemes of [`AUTH_SCHEMES`] as whole words.
fn mask_auth_schemes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut words = text.split_inclusive(char::is_whitespace).peekable();
    while let Some(word) = words.next() {
        out.push_str(word);
        let bare = word
            .trim_end()
            .trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
        let scheme = AUTH_SCHEMES
            .iter()
            .any(|scheme| bare.eq_ignore_ascii_case(scheme));
        if !scheme || word.trim_end().len() == word.len() {
            continue;
        }
        if let Some(credential) = words.next_if(|next| !next.trim().is_empty()) {
            let kept = credential.len() - credential.trim_end_matches(ends_token).len();
            out.push_str(MASK);
            out.push_str(&credential[credential.len() - kept..]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_masked_and_the_rest_kept() {
        assert_eq!(
            text("The connection string 'postgres://u:hunter2@127.0.0.1:99999/test' cannot be parsed."),
            "The connection string 'postgres://u:***@127.0.0.1:99999/test' cannot be parsed."
        );
        assert_eq!(
            text("https://tok123@hooks.example.com/x"),
            "https://***@hooks.example.com/x"
        );
        assert_eq!(text("postgres://u:pa/ss@db/app"), "postgres://u:***@db/app");
        assert_eq!(
            text("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://***@127.0.0.1:5432/test"
        );
        assert_eq!(text("http://h/x and http://h2"), "http://h/x and http://h2");
        assert_eq!(
            text("a http://u:p@h b https://v:q@i c"),
            "a http://u:***@h b https://v:***@i c"
        );
    }

    #[test]
    fn a_url_that_lost_its_scheme_separator_keeps_no_password() {
        for (given, shown) in [
            (
                "postgres//app:WrongSecret987@127.0.0.1:5544",
                "postgres//app:***@127.0.0.1:5544",
            ),
            ("app:pw@host/db", "app:***@host/db"),
            ("postgres:/app:p:w@h/db?x=1", "postgres:/app:***@h/db?x=1"),
            ("'app:pw@h' refused", "'app:***@h' refused"),
            ("postgres:app:pw@h", "postgres:***@h"),
        ] {
            assert_eq!(text(given), shown, "{given}");
        }
        // No password to mask: an e-mail address, a time, a masked one.
        for kept in ["ops@example.com", "12:30 today", "app:***@h", "a:@h"] {
            assert_eq!(text(kept), kept);
        }
    }

    #[test]
    fn secret_pairs_are_masked() {
        assert_eq!(
            text("https://h/hook?token=abc&x=1&api_key=k"),
            "https://h/hook?token=***&x=1&api_key=***"
        );
        assert_eq!(
            text("host=db password=hunter2 user=u"),
            "host=db password=*** user=u"
        );
        assert_eq!(
            text("X-Amz-Signature=f00d, limit=3"),
            "X-Amz-Signature=***, limit=3"
        );
        assert_eq!(text("a == b, x="), "a == b, x=");
    }

    #[test]
    fn auth_schemes_lose_their_credentials() {
        assert_eq!(
            text("header 'Bearer abc.def' refused"),
            "header 'Bearer ***' refused"
        );
        assert_eq!(text("Basic dXNlcjpwdw=="), "Basic ***");
        assert_eq!(
            text(r#"invalid type: string "bearer x1", expected u64"#),
            r#"invalid type: string "bearer ***", expected u64"#
        );
        assert_eq!(text("Bearer"), "Bearer");
    }

    #[test]
    fn any_text_is_handled_whole() {
        assert_eq!(text("ü=é token=ß"), "ü=é token=***");
        assert_eq!(text("\u{80}://ä@ö Bearer ü"), "\u{80}://***@ö Bearer ***");
        assert_eq!(url("ü://ä@ö/ß"), "ü://ö/…");
    }

    #[test]
    fn masking_twice_changes_nothing_more() {
        let once = text("postgres://u:pw@h/db?password=x Bearer t");
        assert_eq!(text(&once), once);
    }

    #[test]
    fn a_url_shows_its_origin_only() {
        assert_eq!(
            url("https://u:p@hooks.example.com:8443/services/T0/B0/XYZ?token=1"),
            "https://hooks.example.com:8443/…"
        );
        assert_eq!(url("http://127.0.0.1:9"), "http://127.0.0.1:9");
        assert_eq!(url("not a url"), "***");
    }
}
