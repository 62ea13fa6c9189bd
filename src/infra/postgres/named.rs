//! Statements whose parameters have names (`$queue`, `$now_ms`) instead of numbers.
//!
//! A statement's text names each parameter where it uses it. [`NamedSql::new`] numbers the
//! names in the order they first appear (the server sees `$1`, `$2`, ...), once, when the
//! statement is written; [`NamedSql::bind`] then takes each value from a [`Params`] by its
//! name, in that order. The order of a statement's values is written nowhere by hand, and two
//! statements that use the same parameters in different orders (the two queue layouts' claims)
//! bind them from one struct.
//!
//! A name is `$` followed by a lower-case ASCII letter or `_`, then lower-case letters, digits
//! and `_`. Statements written this way use no numbered parameters and no dollar quotes.

use sea_orm::Value;

/// Values by parameter name.
pub(crate) trait Params {
    /// The value of parameter `name`; `None` when these parameters have none of that name.
    fn value(&self, name: &str) -> Option<Value>;
}

impl Params for [(&str, Value)] {
    fn value(&self, name: &str) -> Option<Value> {
        self.iter()
            .find(|(known, _)| *known == name)
            .map(|(_, value)| value.clone())
    }
}

impl<const N: usize> Params for [(&str, Value); N] {
    fn value(&self, name: &str) -> Option<Value> {
        self.as_slice().value(name)
    }
}

/// A statement whose `$name` parameters are numbered (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamedSql {
    /// The text the server runs, with `$1`, `$2`, ...
    text: String,
    /// The parameters' names: `$1` is the first.
    names: Vec<String>,
}

impl NamedSql {
    /// Numbers the named parameters of `named`.
    pub(crate) fn new(named: &str) -> Self {
        let mut text = String::with_capacity(named.len());
        let mut names: Vec<String> = Vec::new();
        let mut rest = named;
        while let Some(at) = rest.find('$') {
            text.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let length = name_length(after);
            if length == 0 {
                text.push('$');
                rest = after;
                continue;
            }
            let name = &after[..length];
            let number = match names.iter().position(|known| known == name) {
                Some(index) => index + 1,
                None => {
                    names.push(name.to_owned());
                    names.len()
                }
            };
            text.push('$');
            text.push_str(&number.to_string());
            rest = &after[length..];
        }
        text.push_str(rest);
        Self { text, names }
    }

    /// The text with numbered parameters.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The statement's values, taken from `params` by name in the order the text numbers them.
    /// A name `params` has no value for is an error that names it.
    pub(crate) fn bind<T: Params + ?Sized>(&self, params: &T) -> Result<Vec<Value>, String> {
        self.names
            .iter()
            .map(|name| {
                params
                    .value(name)
                    .ok_or_else(|| format!("the statement's parameter ${name} has no value"))
            })
            .collect()
    }
}

/// The length of the parameter name at the start of `text` (0: none starts there).
fn name_length(text: &str) -> usize {
    let mut bytes = text.bytes();
    match bytes.next() {
        Some(first) if first.is_ascii_lowercase() || first == b'_' => {}
        _ => return 0,
    }
    1 + bytes
        .take_while(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || *byte == b'_')
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_numbered_in_order_of_first_use_and_bound_by_name() {
        let sql = NamedSql::new(
            "SELECT $b_2::bigint, $a FROM t WHERE x = $b_2 AND y::text = $a AND z = 'USD$'",
        );
        assert_eq!(
            sql.text(),
            "SELECT $1::bigint, $2 FROM t WHERE x = $1 AND y::text = $2 AND z = 'USD$'"
        );
        let params = [("a", Value::from("text")), ("b_2", Value::from(7_i64))];
        assert_eq!(
            sql.bind(&params),
            Ok(vec![Value::from(7_i64), Value::from("text")])
        );
    }

    #[test]
    fn a_parameter_without_a_value_is_an_error_naming_it() {
        let sql = NamedSql::new("SELECT $queue, $now_ms");
        let params = [("queue", Value::from("llm"))];
        assert_eq!(
            sql.bind(&params),
            Err("the statement's parameter $now_ms has no value".to_owned())
        );
    }
}
