//! A prompt's segments, as mlx-lm 0.32.2's server splits a chat prompt
//! (`ResponseGenerator._tokenize` in `mlx_lm/server.py`): the system turns,
//! then the rest up to a short reasoning tail, then that tail.
//!
//! The batch feeds each segment in chunks that end at its end
//! (`BatchGenerator.insert_segments`), and the server stores the cache at
//! every segment end but the prompt's last token (its "system" and "user"
//! entries), so a later chat with the same system prompt, or the same
//! conversation again, starts from there. For caches that cannot be
//! trimmed (a Gated DeltaNet state, a short convolution) these are the only
//! entries a different question can reuse. The chunks' ends also decide
//! the bits, so a chat is computed as `mlx_lm.server` computes it.

use crate::thinking::ThinkingMarkers;

/// What a segment holds, which decides what the prompt cache evicts first
/// (mlx-lm's `CacheOrder`: answers, then user turns, then system prompts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    System,
    User,
    /// A whole prompt that is not a chat, the reasoning tail of one, or a
    /// finished sequence (prompt and answer).
    Assistant,
}

/// How far back from a chat prompt's end a reasoning marker starts the
/// tail segment (mlx-lm: "small up to 11 tokens").
const TAIL_REACH: usize = 11;

/// A prompt's segments: where each ends (ascending, the last at the
/// prompt's length) and its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segments {
    ends: Vec<(usize, SegmentKind)>,
}

impl Segments {
    /// A prompt as one segment (`[prompt], ["assistant"]`): a completion's,
    /// or a chat's that does not end with a user turn.
    pub fn whole(len: usize) -> Self {
        Segments {
            ends: vec![(len, SegmentKind::Assistant)],
        }
    }

    /// A chat prompt's segments: `system_end`, where the system turns end
    /// (the first token where the prompt leaves the template's rendering of
    /// the system turns and an empty user turn; 0 when there are none), and
    /// a tail from the last reasoning start marker within the last
    /// [`TAIL_REACH`] tokens.
    pub fn of_chat(prompt: &[i32], system_end: usize, markers: Option<&ThinkingMarkers>) -> Self {
        let len = prompt.len();
        let mut ends = Vec::with_capacity(3);
        let system_end = match system_end > 0 && system_end < len {
            true => {
                ends.push((system_end, SegmentKind::System));
                system_end
            }
            false => 0,
        };
        let tail_start = markers
            .and_then(|m| m.rfind_start(prompt, len.saturating_sub(TAIL_REACH)))
            .unwrap_or(len);
        if system_end < tail_start {
            ends.push((tail_start, SegmentKind::User));
        }
        if tail_start < len {
            ends.push((len, SegmentKind::Assistant));
        }
        match ends.is_empty() {
            true => Segments::whole(len),
            false => Segments { ends },
        }
    }

    /// The segments left after the first `cached` tokens (a prompt cache's
    /// hit), as the server drops them (segments wholly cached go, a partly
    /// cached one keeps its rest), each as its tokens and kind.
    pub fn after(&self, prompt: &[i32], cached: usize) -> Vec<(Vec<i32>, SegmentKind)> {
        let mut start = 0;
        let mut out = Vec::with_capacity(self.ends.len());
        for &(end, kind) in &self.ends {
            let from = start.max(cached);
            if from < end {
                out.push((prompt[from..end].to_vec(), kind));
            }
            start = end;
        }
        out
    }
}

/// Where each segment that ends before the prompt's last token ends, with
/// its kind, in the order the batch reports those ends: every segment's
/// end, but the last segment's is one token earlier (its last token is the
/// first decode step's input), and a last segment of one token has none.
/// `offset` is where the first segment starts in the prompt.
pub fn store_points(
    segments: &[(Vec<i32>, SegmentKind)],
    offset: usize,
) -> Vec<(usize, SegmentKind)> {
    let mut points = Vec::with_capacity(segments.len());
    let mut end = offset;
    for (i, (tokens, kind)) in segments.iter().enumerate() {
        end += tokens.len();
        let last = i + 1 == segments.len();
        match (last, tokens.len()) {
            (false, _) => points.push((end, *kind)),
            (true, 1) => {}
            (true, _) => points.push((end - 1, *kind)),
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use SegmentKind::*;

    fn think(start: &[i32]) -> ThinkingMarkers {
        ThinkingMarkers {
            start: start.to_vec(),
            end: vec![99],
            start_text: "<think>".into(),
            end_text: "</think>".into(),
        }
    }

    #[test]
    fn a_chat_splits_at_the_system_end_and_the_reasoning_tail() {
        let prompt: Vec<i32> = (0..20).collect();
        let s = Segments::of_chat(&prompt, 6, Some(&think(&[17])));
        assert_eq!(s.ends, [(6, System), (17, User), (20, Assistant)]);
        // No system turn, no marker near the end.
        assert_eq!(
            Segments::of_chat(&prompt, 0, Some(&think(&[3]))).ends,
            [(20, User)]
        );
        assert_eq!(Segments::of_chat(&prompt, 0, None).ends, [(20, User)]);
        // A system end at the prompt's end is no segment of its own.
        assert_eq!(Segments::of_chat(&prompt, 20, None).ends, [(20, User)]);
        // The tail may start at the prompt's start when it is short.
        let short = [7, 8, 9];
        assert_eq!(
            Segments::of_chat(&short, 0, Some(&think(&[7]))).ends,
            [(3, Assistant)]
        );
    }

    #[test]
    fn a_cached_prefix_drops_whole_segments_and_cuts_one() {
        let prompt: Vec<i32> = (0..10).collect();
        let s = Segments {
            ends: vec![(4, System), (8, User), (10, Assistant)],
        };
        assert_eq!(
            s.after(&prompt, 0),
            [
                (vec![0, 1, 2, 3], System),
                (vec![4, 5, 6, 7], User),
                (vec![8, 9], Assistant)
            ]
        );
        assert_eq!(
            s.after(&prompt, 4),
            [(vec![4, 5, 6, 7], User), (vec![8, 9], Assistant)]
        );
        assert_eq!(
            s.after(&prompt, 6),
            [(vec![6, 7], User), (vec![8, 9], Assistant)]
        );
        assert_eq!(s.after(&prompt, 9), [(vec![9], Assistant)]);
    }

    #[test]
    fn the_store_points_stop_before_the_last_token() {
        let segments = [(vec![0, 1, 2, 3], System), (vec![4, 5, 6, 7], User)];
        assert_eq!(store_points(&segments, 0), [(4, System), (7, User)]);
        let segments = [(vec![6, 7], User), (vec![8], Assistant)];
        assert_eq!(store_points(&segments, 6), [(8, User)]);
        assert_eq!(store_points(&[(vec![9], Assistant)], 9), []);
    }
}
