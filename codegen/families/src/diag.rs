//! Located diagnostics: every error names file:line:column, the field path, what was
//! expected and a hint.

use std::fmt;

/// One segment of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Seg {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// A path into a spec document, e.g. `attention.head_dim` or `layers.pattern[3]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    /// The document root.
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }
    /// Parses `a.b[3].c`; keys containing `.` are written `["a.b"]`.
    pub fn parse(s: &str) -> Self {
        let mut segs = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        let mut cur = String::new();
        while i < b.len() {
            match b[i] {
                b'.' => {
                    if !cur.is_empty() {
                        segs.push(Seg::Key(std::mem::take(&mut cur)));
                    }
                    i += 1;
                }
                b'[' => {
                    if !cur.is_empty() {
                        segs.push(Seg::Key(std::mem::take(&mut cur)));
                    }
                    if b.get(i + 1) == Some(&b'"') {
                        let end = s[i + 2..].find("\"]").map(|e| i + 2 + e).unwrap_or(b.len());
                        segs.push(Seg::Key(s[(i + 2).min(end)..end].to_string()));
                        i = end + 2;
                    } else {
                        let end = s[i..].find(']').map(|e| i + e).unwrap_or(b.len());
                        segs.push(Seg::Index(s[i + 1..end].parse().unwrap_or(0)));
                        i = end + 1;
                    }
                }
                _ => {
                    let ch = s[i..].chars().next().unwrap_or(' ');
                    cur.push(ch);
                    i += ch.len_utf8();
                }
            }
        }
        if !cur.is_empty() {
            segs.push(Seg::Key(cur));
        }
        FieldPath(segs)
    }
    /// This path plus a key.
    pub fn key(&self, k: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(k.to_string()));
        p
    }
    /// This path plus an index.
    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }
    /// The last key, if the path ends in one.
    pub fn last_key(&self) -> Option<&str> {
        match self.0.last() {
            Some(Seg::Key(k)) => Some(k),
            _ => None,
        }
    }
    /// Whether `self` starts with `prefix`.
    pub fn starts_with(&self, prefix: &FieldPath) -> bool {
        self.0.len() >= prefix.0.len() && self.0[..prefix.0.len()] == prefix.0[..]
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("<document>");
        }
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Seg::Key(k) if k.contains(['.', '[', ']', '"']) || k.is_empty() => {
                    write!(f, "[\"{k}\"]")?
                }
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?
                }
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// One located error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// File (or origin) the error is in.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Field path the error is about.
    pub path: FieldPath,
    /// What is wrong.
    pub message: String,
    /// What was expected.
    pub expected: String,
    /// How to fix it.
    pub hint: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: error at {}: {} (expected {})\n  hint: {}",
            self.file, self.line, self.column, self.path, self.message, self.expected, self.hint
        )
    }
}

/// All errors found in one load, in file order. Never empty when returned as an error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// Number of errors.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Iterates the errors.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }
    pub(crate) fn sort(&mut self) {
        self.0.sort_by(|a, b| {
            (a.file.as_str(), a.line, a.column, &a.path, &a.message).cmp(&(
                b.file.as_str(),
                b.line,
                b.column,
                &b.path,
                &b.message,
            ))
        });
        self.0.dedup();
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.0 {
            writeln!(f, "{d}")?;
        }
        let n = self.0.len();
        write!(f, "{n} error{}", if n == 1 { "" } else { "s" })
    }
}

impl std::error::Error for Diagnostics {}

/// An error before it is located: path, what, expected, hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issue {
    pub path: FieldPath,
    pub message: String,
    pub expected: String,
    pub hint: String,
}

impl Issue {
    pub fn new(
        path: FieldPath,
        message: impl Into<String>,
        expected: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Issue {
            path,
            message: message.into(),
            expected: expected.into(),
            hint: hint.into(),
        }
    }
}
