//! A token's own bytes, for log-probabilities. A byte-level BPE piece
//! (GPT-2's byte-to-character map: Qwen, Llama 3, ...) or a SentencePiece
//! byte-fallback piece (`<0xE2>`: Gemma, Llama 2, ...) can stand for part of
//! a UTF-8 character, and decoding it alone gives U+FFFD, the same for every
//! such token. Its bytes tell them apart: chat's `bytes` is them, and a
//! token whose bytes are not UTF-8 is labelled `bytes:\xe2\x80` (OpenAI's
//! label for such tokens).

use tokenizers::{DecoderWrapper, Tokenizer};

use crate::tokens::decode;

/// A token as log-probabilities show it.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenText {
    pub id: i32,
    /// The token's bytes.
    pub bytes: Vec<u8>,
}

impl TokenText {
    /// The token's text when its bytes are UTF-8, else `bytes:` and each
    /// byte as `\xNN`.
    pub fn label(&self) -> String {
        match std::str::from_utf8(&self.bytes) {
            Ok(text) => text.to_owned(),
            Err(_) => {
                let escaped: String = self.bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
                format!("bytes:{escaped}")
            }
        }
    }

    /// Characters of completion text the token stands for (a partial
    /// character counts as the one replacement character decoding gives).
    pub fn chars(&self) -> usize {
        String::from_utf8_lossy(&self.bytes).chars().count()
    }
}

/// How a tokenizer's vocabulary pieces spell bytes (from its decoder).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Pieces {
    /// GPT-2's byte-level map: every character of a piece is one byte.
    ByteLevel,
    /// SentencePiece: a piece `<0xNN>` is the byte NN; the others are text.
    ByteFallback,
    /// Pieces are text: a token's bytes are its decoded text.
    Text,
}

fn pieces_of(decoder: Option<&DecoderWrapper>) -> Pieces {
    match decoder {
        None => Pieces::Text,
        Some(DecoderWrapper::ByteLevel(_)) => Pieces::ByteLevel,
        Some(DecoderWrapper::ByteFallback(_)) => Pieces::ByteFallback,
        Some(DecoderWrapper::Sequence(sequence)) => sequence
            .get_decoders()
            .iter()
            .map(|d| pieces_of(Some(d)))
            .find(|p| *p != Pieces::Text)
            .unwrap_or(Pieces::Text),
        Some(
            DecoderWrapper::BPE(_)
            | DecoderWrapper::WordPiece(_)
            | DecoderWrapper::Metaspace(_)
            | DecoderWrapper::CTC(_)
            | DecoderWrapper::Replace(_)
            | DecoderWrapper::Fuse(_)
            | DecoderWrapper::Strip(_),
        ) => Pieces::Text,
    }
}

/// The byte GPT-2's byte-level map shows as `c`: the printable Latin-1
/// bytes as themselves, the 68 others, in order, as U+0100 on.
fn byte_level_byte(c: char) -> Option<u8> {
    let shown_as_itself = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let code = u32::from(c);
    if code < 0x100 {
        return shown_as_itself(code).then_some(code as u8);
    }
    let nth = usize::try_from(code - 0x100).ok()?;
    (0u32..0x100)
        .filter(|&b| !shown_as_itself(b))
        .nth(nth)
        .map(|b| b as u8)
}

/// `<0xNN>`'s byte.
fn byte_fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// Token `id` with its bytes.
pub fn token_text(tokenizer: &Tokenizer, id: i32) -> Result<TokenText, String> {
    let bytes = token_bytes(tokenizer, id)?;
    Ok(TokenText { id, bytes })
}

fn token_bytes(tokenizer: &Tokenizer, id: i32) -> Result<Vec<u8>, String> {
    let unsigned = u32::try_from(id).map_err(|_| format!("token id {id} is negative"))?;
    // Added tokens (specials like <|im_end|>) are kept as written.
    let added = tokenizer.get_added_vocabulary().get_added_tokens_decoder();
    if let Some(token) = added.get(&unsigned) {
        return Ok(token.content.clone().into_bytes());
    }
    let piece = tokenizer.id_to_token(unsigned);
    let bytes = match (pieces_of(tokenizer.get_decoder()), piece.as_deref()) {
        (Pieces::ByteLevel, Some(piece)) => piece.chars().map(byte_level_byte).collect(),
        (Pieces::ByteFallback, Some(piece)) => byte_fallback_byte(piece).map(|b| vec![b]),
        (Pieces::Text, _) | (Pieces::ByteLevel | Pieces::ByteFallback, None) => None,
    };
    match bytes {
        Some(bytes) => Ok(bytes),
        None => Ok(decode(tokenizer, &[unsigned])?.into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_characters_are_their_bytes() {
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        // GPT-2's map: space is U+0120 ('Ġ'), newline U+010A ('Ċ'), 0xAD U+0143.
        assert_eq!(byte_level_byte('\u{120}'), Some(b' '));
        assert_eq!(byte_level_byte('\u{10A}'), Some(b'\n'));
        assert_eq!(byte_level_byte('\u{143}'), Some(0xAD));
        assert_eq!(byte_level_byte('â'), Some(0xE2));
        assert_eq!(byte_level_byte('\u{144}'), None);
        // Every byte is shown by exactly one character.
        let shown: std::collections::HashSet<u8> = (0u32..0x144)
            .filter_map(char::from_u32)
            .filter_map(byte_level_byte)
            .collect();
        assert_eq!(shown.len(), 256);
        assert_eq!(byte_fallback_byte("<0xE2>"), Some(0xE2));
        assert_eq!(byte_fallback_byte("<0xE>"), None);
        assert_eq!(byte_fallback_byte("▁the"), None);
    }

    #[test]
    fn a_partial_character_is_labelled_by_its_bytes() {
        let lone = TokenText {
            id: 5,
            bytes: vec![0xE2, 0x80],
        };
        assert_eq!(lone.label(), "bytes:\\xe2\\x80");
        assert_eq!(lone.chars(), 1);
        let word = TokenText {
            id: 6,
            bytes: " fox".into(),
        };
        assert_eq!(word.label(), " fox");
        assert_eq!(word.chars(), 4);
    }
}
