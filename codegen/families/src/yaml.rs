//! The located layer under serde: byte-level checks (size, UTF-8, tabs) and a node tree
//! with line:column for every key and value, built from yaml-rust2's event parser.
//! serde_yaml exposes no spans, so this tree maps a field path to its location; it also
//! rejects what serde would silently accept (duplicate keys, anchors/aliases, tags).

use crate::diag::{FieldPath, Issue, Seg};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::Marker;

/// Largest spec file accepted, checked before parsing.
pub const MAX_SPEC_BYTES: usize = 1 << 20;

/// Deepest nesting of mappings and sequences accepted. A spec nests a few
/// levels; the cap keeps hostile input (10k nested `- - -`) from building a
/// tree whose recursive drop or walk would overflow the stack.
pub(crate) const MAX_NESTING: usize = 32;

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Loc {
    pub line: usize,
    pub column: usize,
}

impl Loc {
    pub const START: Loc = Loc { line: 1, column: 1 };
    fn of(m: &Marker) -> Loc {
        // yaml-rust2 markers: 1-based line, 0-based column.
        Loc {
            line: m.line().max(1),
            column: m.col() + 1,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum NodeKind {
    Scalar(String),
    Seq(Vec<Node>),
    /// (key, key location, value)
    Map(Vec<(String, Loc, Node)>),
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub loc: Loc,
    pub kind: NodeKind,
}

impl Node {
    /// The location that best names `path`: a scalar value where it is one, the key of a
    /// mapping or sequence value (its own start marker is less telling), else the
    /// deepest existing ancestor (a missing field points at its parent's key).
    pub fn locate(&self, path: &FieldPath) -> Loc {
        let mut node = self;
        let mut key_loc: Option<Loc> = self.first_key_loc();
        for seg in &path.0 {
            let next = match (seg, &node.kind) {
                (Seg::Key(k), NodeKind::Map(entries)) => entries
                    .iter()
                    .find(|(key, _, _)| key == k)
                    .map(|(_, kl, v)| (Some(*kl), v)),
                (Seg::Index(i), NodeKind::Seq(items)) => items.get(*i).map(|v| (None, v)),
                _ => None,
            };
            match next {
                Some((kl, n)) => {
                    node = n;
                    key_loc = kl.or(Some(n.loc));
                }
                None => return key_loc.unwrap_or(node.loc),
            }
        }
        match node.kind {
            NodeKind::Scalar(_) => node.loc,
            _ => key_loc.unwrap_or(node.loc),
        }
    }
    fn first_key_loc(&self) -> Option<Loc> {
        match &self.kind {
            NodeKind::Map(e) => e.first().map(|x| x.1),
            _ => None,
        }
    }
    /// The location of the key `path` ends in, when it exists (for unknown keys).
    pub fn locate_key(&self, path: &FieldPath) -> Option<Loc> {
        let (last, parent) = path.0.split_last()?;
        let Seg::Key(k) = last else { return None };
        let mut node = self;
        for seg in parent {
            node = match (seg, &node.kind) {
                (Seg::Key(k), NodeKind::Map(entries)) => {
                    &entries.iter().find(|(key, _, _)| key == k)?.2
                }
                (Seg::Index(i), NodeKind::Seq(items)) => items.get(*i)?,
                _ => return None,
            };
        }
        match &node.kind {
            NodeKind::Map(entries) => entries.iter().find(|(key, _, _)| key == k).map(|e| e.1),
            _ => None,
        }
    }
    /// Whether the top-level mapping has `key`.
    pub fn has_key(&self, key: &str) -> bool {
        matches!(&self.kind, NodeKind::Map(e) if e.iter().any(|(k, _, _)| k == key))
    }
}

/// A located issue from the byte or event layer.
pub(crate) type Located = (Loc, Issue);

fn loc_of_byte(src: &[u8], at: usize) -> Loc {
    let before = &src[..at.min(src.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    Loc { line, column }
}

/// Size, UTF-8 and tab checks. On success returns the text.
pub(crate) fn check_bytes(src: &[u8]) -> Result<&str, Vec<Located>> {
    if src.len() > MAX_SPEC_BYTES {
        return Err(vec![(
            Loc::START,
            Issue::new(
                FieldPath::root(),
                format!("file is {} bytes, over the limit", src.len()),
                format!("at most {MAX_SPEC_BYTES} bytes"),
                "a spec is a few hundred lines; check that the right file was given",
            ),
        )]);
    }
    let text = match std::str::from_utf8(src) {
        Ok(t) => t,
        Err(e) => {
            return Err(vec![(
                loc_of_byte(src, e.valid_up_to()),
                Issue::new(
                    FieldPath::root(),
                    format!("invalid UTF-8 at byte {}", e.valid_up_to()),
                    "a UTF-8 text file",
                    "re-save the file as UTF-8",
                ),
            )])
        }
    };
    let mut out = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if let Some(col) = line.chars().position(|c| c == '\t') {
            out.push((
                Loc {
                    line: i + 1,
                    column: col + 1,
                },
                Issue::new(
                    FieldPath::root(),
                    "tab character",
                    "spaces only (YAML forbids tabs in indentation; specs forbid them everywhere)",
                    "replace the tab with spaces",
                ),
            ));
        }
    }
    if out.is_empty() {
        Ok(text)
    } else {
        Err(out)
    }
}

/// An open container: (node, pending map key, whether a path segment was pushed).
type Open = (Node, Option<(String, Loc)>, bool);

struct Builder {
    stack: Vec<Open>,
    root: Option<Node>,
    issues: Vec<Located>,
    documents: usize,
    path: Vec<Seg>,
    /// Set when nesting passed [`MAX_NESTING`]: the scan stops.
    too_deep: bool,
}

const NO_ANCHORS: &str =
    "specs do not use anchors, aliases or tags: write values out so diffs show them";

impl Builder {
    /// Whether the next scalar is a mapping key.
    fn expecting_key(&self) -> bool {
        matches!(
            self.stack.last(),
            Some((
                Node {
                    kind: NodeKind::Map(_),
                    ..
                },
                None,
                _
            ))
        )
    }

    /// The path of the value about to start (None when it is a key).
    fn child_path(&self) -> Option<FieldPath> {
        let mut p = self.path.clone();
        match self.stack.last() {
            None => {}
            Some((parent, pending, _)) => match &parent.kind {
                NodeKind::Seq(items) => p.push(Seg::Index(items.len())),
                NodeKind::Map(_) => match pending {
                    Some((k, _)) => p.push(Seg::Key(k.clone())),
                    None => return None,
                },
                NodeKind::Scalar(_) => {}
            },
        }
        Some(FieldPath(p))
    }

    fn push_value(&mut self, node: Node) {
        let Some((parent, pending, _)) = self.stack.last_mut() else {
            if self.root.is_none() {
                self.root = Some(node);
            }
            return;
        };
        match &mut parent.kind {
            NodeKind::Seq(items) => items.push(node),
            NodeKind::Map(entries) => match pending.take() {
                None => match node.kind {
                    NodeKind::Scalar(k) => *pending = Some((k, node.loc)),
                    _ => {
                        self.issues.push((
                            node.loc,
                            Issue::new(
                                FieldPath(self.path.clone()),
                                "a mapping key that is not a plain scalar",
                                "a field name",
                                "keys are field names or module paths",
                            ),
                        ));
                        *pending = Some((String::new(), node.loc));
                    }
                },
                Some((k, kloc)) => {
                    if let Some((_, first, _)) = entries.iter().find(|(e, _, _)| *e == k) {
                        let first = *first;
                        let mut path = self.path.clone();
                        path.push(Seg::Key(k.clone()));
                        self.issues.push((
                            kloc,
                            Issue::new(
                                FieldPath(path),
                                format!("duplicate key `{k}` (first at line {})", first.line),
                                "each key once per mapping",
                                "delete one of the two entries; YAML parsers silently keep one",
                            ),
                        ));
                    } else {
                        entries.push((k, kloc, node));
                    }
                }
            },
            NodeKind::Scalar(_) => {}
        }
    }

    fn reject(&mut self, loc: Loc, path: FieldPath, what: &str) {
        self.issues
            .push((loc, Issue::new(path, what, "plain values", NO_ANCHORS)));
    }

    fn on_event(&mut self, ev: Event, mark: Marker) {
        let loc = Loc::of(&mark);
        match ev {
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    self.issues.push((
                        loc,
                        Issue::new(
                            FieldPath::root(),
                            "a second YAML document",
                            "one document per file",
                            "remove the `---` and what follows, or split the file",
                        ),
                    ));
                }
            }
            Event::Alias(_) => {
                let path = self
                    .child_path()
                    .unwrap_or_else(|| FieldPath(self.path.clone()));
                self.reject(loc, path, "a YAML alias");
                self.push_value(Node {
                    loc,
                    kind: NodeKind::Scalar(String::new()),
                });
            }
            Event::Scalar(value, _style, anchor, tag) => {
                if anchor != 0 || tag.is_some() {
                    let path = self
                        .child_path()
                        .unwrap_or_else(|| FieldPath(self.path.clone()));
                    let what = if tag.is_some() {
                        "a YAML tag"
                    } else {
                        "a YAML anchor"
                    };
                    self.reject(loc, path, what);
                }
                self.push_value(Node {
                    loc,
                    kind: NodeKind::Scalar(value),
                });
            }
            Event::SequenceStart(anchor, ref tag) | Event::MappingStart(anchor, ref tag) => {
                if self.stack.len() >= MAX_NESTING {
                    self.issues.push((
                        loc,
                        Issue::new(
                            FieldPath(self.path.clone()),
                            format!("nesting deeper than {MAX_NESTING} levels"),
                            format!("at most {MAX_NESTING} nested mappings or sequences"),
                            "a spec nests a few levels; check that the right file was given",
                        ),
                    ));
                    self.too_deep = true;
                    return;
                }
                let is_map = matches!(ev, Event::MappingStart(..));
                let key_position = self.expecting_key();
                let path = self.child_path();
                if anchor != 0 || tag.is_some() {
                    let p = path.clone().unwrap_or_else(|| FieldPath(self.path.clone()));
                    let what = if tag.is_some() {
                        "a YAML tag"
                    } else {
                        "a YAML anchor"
                    };
                    self.reject(loc, p, what);
                }
                let pushed = match (&path, key_position) {
                    (Some(p), false) if p.0.len() > self.path.len() => {
                        self.path = p.0.clone();
                        true
                    }
                    _ => false,
                };
                let kind = if is_map {
                    NodeKind::Map(Vec::new())
                } else {
                    NodeKind::Seq(Vec::new())
                };
                self.stack.push((Node { loc, kind }, None, pushed));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, _, pushed)) = self.stack.pop() {
                    if pushed {
                        self.path.pop();
                    }
                    self.push_value(node);
                }
            }
            _ => {}
        }
    }
}

/// Parses `text` into a located node tree, rejecting duplicate keys, anchors, aliases,
/// tags and multiple documents. The scan stops at the first syntax error.
pub(crate) fn parse_tree(text: &str) -> Result<Node, Vec<Located>> {
    let mut b = Builder {
        stack: Vec::new(),
        root: None,
        issues: Vec::new(),
        documents: 0,
        path: Vec::new(),
        too_deep: false,
    };
    let mut parser = Parser::new_from_str(text);
    loop {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => break,
            Ok((ev, mark)) => {
                b.on_event(ev, mark);
                if b.too_deep {
                    return Err(b.issues);
                }
            }
            Err(e) => {
                b.issues.push((
                    Loc::of(e.marker()),
                    Issue::new(
                        FieldPath(b.path.clone()),
                        format!("YAML syntax error: {}", e.info()),
                        "well-formed YAML",
                        "check indentation, colons and brackets near this position",
                    ),
                ));
                return Err(b.issues);
            }
        }
    }
    if !b.issues.is_empty() {
        return Err(b.issues);
    }
    match b.root {
        Some(
            root @ Node {
                kind: NodeKind::Map(_),
                ..
            },
        ) => Ok(root),
        Some(other) => Err(vec![(
            other.loc,
            Issue::new(
                FieldPath::root(),
                "the document is not a mapping",
                "a mapping with format_version, identity, ...",
                "start from a file in specs/ or see docs/spec-format.md",
            ),
        )]),
        None => Err(vec![(
            Loc::START,
            Issue::new(
                FieldPath::root(),
                "the file is empty",
                "a mapping with format_version, identity, ...",
                "start from a file in specs/ or see docs/spec-format.md",
            ),
        )]),
    }
}
