//! Rows written as one JSON array: [`JsonRows`], the input of the statements that write many
//! rows at once (a group of parks, a group of results).

/// Rows written as one JSON array, so that one statement with one `jsonb` parameter
/// (`jsonb_to_recordset`) writes them all: the statement's text is the same for any number
/// of rows, and the server prepares it once.
pub(crate) struct JsonRows {
    text: String,
    fields_in_row: usize,
}

impl JsonRows {
    /// An empty array.
    pub(crate) fn new() -> Self {
        Self {
            text: String::from("["),
            fields_in_row: 0,
        }
    }

    /// Starts the next row; its fields follow.
    pub(crate) fn row(&mut self) -> &mut Self {
        if self.text.len() > 1 {
            self.text.push_str("},");
        }
        self.text.push('{');
        self.fields_in_row = 0;
        self
    }

    fn name(&mut self, name: &str) {
        if self.fields_in_row > 0 {
            self.text.push(',');
        }
        self.fields_in_row += 1;
        self.text.push('"');
        self.text.push_str(name);
        self.text.push_str("\":");
    }

    /// A number field.
    pub(crate) fn int(&mut self, name: &str, value: i64) -> &mut Self {
        self.name(name);
        self.text.push_str(&value.to_string());
        self
    }

    /// A number field, or `null`.
    pub(crate) fn int_or_null(&mut self, name: &str, value: Option<i64>) -> &mut Self {
        match value {
            Some(value) => self.int(name, value),
            None => self.json(name, None),
        }
    }

    /// A text field, or `null`.
    pub(crate) fn text(&mut self, name: &str, value: Option<&str>) -> &mut Self {
        self.name(name);
        match value {
            Some(text) => self
                .text
                .push_str(&serde_json::Value::from(text).to_string()),
            None => self.text.push_str("null"),
        }
        self
    }

    /// A field holding `value`, JSON text already, or `null`.
    pub(crate) fn json(&mut self, name: &str, value: Option<&str>) -> &mut Self {
        self.name(name);
        self.text.push_str(value.unwrap_or("null"));
        self
    }

    /// The array.
    pub(crate) fn finish(mut self) -> String {
        if self.text.len() > 1 {
            self.text.push('}');
        }
        self.text.push(']');
        self.text
    }
}
