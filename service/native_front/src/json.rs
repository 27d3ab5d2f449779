//! A small strict RFC 8259 JSON parser.
//!
//! * Objects, arrays, strings, numbers, `true` / `false` / `null`; white space is only
//!   space, tab, LF and CR; trailing garbage after the top-level value is an error.
//! * Numbers are kept as their source text ([`Value::Number`]) so callers can tell a plain
//!   integer (`-?[0-9]+`) from a number with a fraction or an exponent.
//! * Duplicate keys in any object are an error ([`JsonError::DuplicateKey`]).
//! * Nesting deeper than [`ParseOptions::max_depth`] is an error.
//! * A string with a backslash escape is an error ([`JsonError::Escape`]) unless
//!   [`ParseOptions::allow_escapes`] is set (the request fast path relays such bodies; the
//!   configuration given by Python may contain escapes).
//! * The input must be UTF-8; control characters (U+0000–U+001F) inside strings are errors.

use std::borrow::Cow;
use std::collections::HashSet;

/// A parsed JSON value borrowing from the source text where it can.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number, as its source text (already checked against the RFC 8259 grammar).
    Number(&'a str),
    /// A string (escapes decoded when allowed).
    Str(Cow<'a, str>),
    /// An array.
    Array(Vec<Value<'a>>),
    /// An object, members in source order (keys are unique).
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// The member `key` of an object (None for other values or a missing key).
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The members, if this is an object.
    pub fn as_object(&self) -> Option<&[(Cow<'a, str>, Value<'a>)]> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The items, if this is an array.
    pub fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The number's source text if it is a plain integer (`-?[0-9]+`: no fraction, no exponent).
    pub fn plain_integer_text(&self) -> Option<&'a str> {
        match self {
            Value::Number(t) if !t.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) => Some(t),
            _ => None,
        }
    }

    /// A plain non-negative integer (no sign) that fits `u64`.
    pub fn as_plain_u64(&self) -> Option<u64> {
        let t = self.plain_integer_text()?;
        if t.starts_with('-') {
            return None;
        }
        t.parse().ok()
    }

    /// A number (any form) as f64, if this is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(t) => t.parse().ok(),
            _ => None,
        }
    }
}

/// Why a text is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonError {
    /// Not JSON (the byte offset where it went wrong).
    Syntax(usize),
    /// Not valid UTF-8.
    InvalidUtf8,
    /// A string with a backslash escape while escapes are not allowed.
    Escape,
    /// The same key twice in one object.
    DuplicateKey,
    /// Nesting beyond the depth limit.
    TooDeep,
}

/// Parser settings.
#[derive(Debug, Clone, Copy)]
pub struct ParseOptions {
    /// Decode backslash escapes (else they are [`JsonError::Escape`]).
    pub allow_escapes: bool,
    /// Most nested arrays/objects (the top-level container is depth 1).
    pub max_depth: usize,
}

impl ParseOptions {
    /// The request fast path's settings: no escapes, depth 64.
    pub const STRICT: ParseOptions = ParseOptions {
        allow_escapes: false,
        max_depth: 64,
    };
    /// Escapes decoded, depth 64 (configuration text).
    pub const LENIENT: ParseOptions = ParseOptions {
        allow_escapes: true,
        max_depth: 64,
    };
}

/// Parse `bytes` as one JSON text.
pub fn parse(bytes: &[u8], options: ParseOptions) -> Result<Value<'_>, JsonError> {
    let text = std::str::from_utf8(bytes).map_err(|_| JsonError::InvalidUtf8)?;
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        options,
    };
    p.skip_ws();
    let value = p.value(0)?;
    p.skip_ws();
    if p.pos != p.bytes.len() {
        return Err(JsonError::Syntax(p.pos));
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    options: ParseOptions,
}

impl<'a> Parser<'a> {
    fn skip_ws(&mut self) {
        while let Some(&b) = self.bytes.get(self.pos) {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn err<T>(&self) -> Result<T, JsonError> {
        Err(JsonError::Syntax(self.pos))
    }

    fn literal(&mut self, word: &str, value: Value<'a>) -> Result<Value<'a>, JsonError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            self.err()
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        match self.bytes.get(self.pos) {
            None => self.err(),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => self.err(),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.bytes.get(self.pos), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Value<'a>, JsonError> {
        let start = self.pos;
        if self.bytes[self.pos] == b'-' {
            self.pos += 1;
        }
        match self.bytes.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.err(),
        }
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return self.err();
            }
        }
        if matches!(self.bytes.get(self.pos), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.bytes.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return self.err();
            }
        }
        Ok(Value::Number(&self.text[start..self.pos]))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let Some(chunk) = self.bytes.get(self.pos..self.pos + 4) else {
            return self.err();
        };
        let mut v = 0u32;
        for &b in chunk {
            let d = (b as char).to_digit(16).ok_or(JsonError::Syntax(self.pos))?;
            v = v * 16 + d;
        }
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<Cow<'a, str>, JsonError> {
        self.pos += 1; // opening quote
        let start = self.pos;
        // Fast scan: no escapes.
        loop {
            match self.bytes.get(self.pos) {
                None => return self.err(),
                Some(b'"') => {
                    let s = &self.text[start..self.pos];
                    self.pos += 1;
                    return Ok(Cow::Borrowed(s));
                }
                Some(b'\\') => break,
                Some(&b) if b < 0x20 => return self.err(),
                Some(_) => self.pos += 1,
            }
        }
        if !self.options.allow_escapes {
            return Err(JsonError::Escape);
        }
        let mut out = String::from(&self.text[start..self.pos]);
        loop {
            match self.bytes.get(self.pos) {
                None => return self.err(),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let Some(&e) = self.bytes.get(self.pos) else {
                        return self.err();
                    };
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                                    return self.err();
                                }
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return self.err();
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return self.err();
                            } else {
                                hi
                            };
                            out.push(char::from_u32(code).ok_or(JsonError::Syntax(self.pos))?);
                        }
                        _ => return self.err(),
                    }
                }
                Some(&b) if b < 0x20 => return self.err(),
                Some(_) => {
                    // copy one UTF-8 character
                    let ch = self.text[self.pos..].chars().next().expect("in bounds");
                    out.push(ch);
                    self.pos += ch.len_utf8();
                }
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        if depth > self.options.max_depth {
            return Err(JsonError::TooDeep);
        }
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return self.err(),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        if depth > self.options.max_depth {
            return Err(JsonError::TooDeep);
        }
        self.pos += 1;
        let mut members: Vec<(Cow<'a, str>, Value<'a>)> = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        let mut seen: Option<HashSet<Cow<'a, str>>> = None;
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return self.err();
            }
            let key = self.string()?;
            // duplicate check: linear for small objects, a set past 16 members
            let duplicate = match &mut seen {
                Some(set) => !set.insert(key.clone()),
                None => {
                    let dup = members.iter().any(|(k, _)| *k == key);
                    if members.len() >= 16 {
                        let mut set: HashSet<Cow<'a, str>> = members.iter().map(|(k, _)| k.clone()).collect();
                        set.insert(key.clone());
                        seen = Some(set);
                    }
                    dup
                }
            };
            if duplicate {
                return Err(JsonError::DuplicateKey);
            }
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b':') {
                return self.err();
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth)?;
            members.push((key, value));
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                _ => return self.err(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(s: &str) -> Result<Value<'_>, JsonError> {
        parse(s.as_bytes(), ParseOptions::STRICT)
    }

    #[test]
    fn valid_texts() {
        for s in [
            "{}",
            "[]",
            " {\"a\" : [1, -0, 2.5, -1e3, 1E+2, 0.0e-1, true, false, null, \"x\"]} ",
            "\"plain\"",
            "0",
            "-12",
            "[[[]]]",
            "{\"é\":\"ü\"}",
        ] {
            assert!(strict(s).is_ok(), "{s}");
        }
        let v = strict("{\"a\":12,\"b\":1.0,\"c\":1e2,\"d\":-3}").unwrap();
        assert_eq!(v.get("a").unwrap().plain_integer_text(), Some("12"));
        assert_eq!(v.get("a").unwrap().as_plain_u64(), Some(12));
        assert_eq!(v.get("b").unwrap().plain_integer_text(), None);
        assert_eq!(v.get("c").unwrap().plain_integer_text(), None);
        assert_eq!(v.get("d").unwrap().plain_integer_text(), Some("-3"));
        assert_eq!(v.get("d").unwrap().as_plain_u64(), None);
    }

    #[test]
    fn invalid_texts() {
        for s in [
            "",
            " ",
            "{",
            "{\"a\"}",
            "{\"a\":1,}",
            "[1,]",
            "[1 2]",
            "01",
            "1.",
            ".5",
            "1e",
            "+1",
            "-",
            "NaN",
            "Infinity",
            "tru",
            "nul",
            "{'a':1}",
            "{\"a\":1} x",
            "{} {}",
            "\"unterminated",
            "\"tab\there\"",
            "[1]]",
            "{a:1}",
        ] {
            assert!(
                matches!(strict(s), Err(JsonError::Syntax(_))),
                "{s:?} -> {:?}",
                strict(s)
            );
        }
        assert_eq!(parse(b"\"\xff\"", ParseOptions::STRICT), Err(JsonError::InvalidUtf8));
    }

    #[test]
    fn duplicates_are_rejected() {
        assert_eq!(strict("{\"a\":1,\"a\":2}"), Err(JsonError::DuplicateKey));
        assert_eq!(
            strict("[{\"x\":{\"b\":1,\"c\":2,\"b\":3}}]"),
            Err(JsonError::DuplicateKey)
        );
        // past the linear-scan threshold
        let mut s = String::from("{");
        for i in 0..40 {
            s.push_str(&format!("\"k{i}\":{i},"));
        }
        s.push_str("\"k3\":0}");
        assert_eq!(strict(&s), Err(JsonError::DuplicateKey));
        // escaped duplicate (decoded equal) with escapes allowed
        assert_eq!(
            parse(b"{\"a\":1,\"\\u0061\":2}", ParseOptions::LENIENT),
            Err(JsonError::DuplicateKey)
        );
    }

    #[test]
    fn escapes() {
        assert_eq!(strict("\"a\\nb\""), Err(JsonError::Escape));
        assert_eq!(strict("{\"na\\u006de\":1}"), Err(JsonError::Escape));
        let v = parse(
            b"\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"",
            ParseOptions::LENIENT,
        )
        .unwrap();
        assert_eq!(v.as_str(), Some("q\"\\/\u{8}\u{c}\n\r\té\u{1F600}"));
        for bad in [
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\ud83d\"",
            "\"\\ude00\"",
            "\"\\ud83d\\u0041\"",
        ] {
            assert!(
                matches!(parse(bad.as_bytes(), ParseOptions::LENIENT), Err(JsonError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn depth_limit() {
        let ok = "[".repeat(64) + &"]".repeat(64);
        assert!(strict(&ok).is_ok());
        let deep = "[".repeat(65) + &"]".repeat(65);
        assert_eq!(strict(&deep), Err(JsonError::TooDeep));
        let deep_obj = "{\"a\":".repeat(65) + "1" + &"}".repeat(65);
        assert_eq!(strict(&deep_obj), Err(JsonError::TooDeep));
    }
}
