//! A count-only `o200k_base` byte-pair encoder: the token counts of tiktoken's encoder
//! (`encode_ordinary(text).len()`) from about 3 MB of heap (and the 1.6 MB table in the binary), where tiktoken-rs's `CoreBPE`
//! holds an encoder, a decoder, a sorted token list and 128 regex copies (tens of MB per
//! process).
//!
//! The ranks are in `o200k_base.bin`, generated from tiktoken-rs's copy of OpenAI's
//! `o200k_base.tiktoken` (rank order, each token as a 1-byte length then its bytes; ranks are
//! dense, 0..199,998). The test `the_table_is_tiktokens` checks every token of it against
//! tiktoken-rs; `regenerate_the_table` (ignored) writes it again.
//!
//! The splitting pattern is tiktoken-rs's `O200K_BASE_PAT_STR` and the merge loops are ports
//! of tiktoken's `_byte_pair_merge` (pieces under 100 bytes) and `_byte_pair_merge_large`
//! (a heap, for long pieces), counting merges instead of collecting ranks: a piece of `n`
//! bytes that merges `m` times is `n - m` tokens.

use fancy_regex::Regex;
use hashbrown::HashTable;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

/// The rank table: 1-byte length, then the token's bytes, for each rank in order.
static TABLE: &[u8] = include_bytes!("o200k_base.bin");

/// tiktoken's o200k_base splitting pattern (tiktoken `openai_public.py`, `o200k_base`).
const PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+"
);

/// No merge (tiktoken's `Rank::MAX`).
const NONE: u32 = u32::MAX;

/// The count-only encoder: the split pattern and a rank lookup over [`TABLE`].
pub(super) struct Counter {
    regex: Regex,
    /// (where the token starts in [`TABLE`], its rank), hashed by the token's bytes: the start
    /// beside the rank saves a lookup in `starts` per probe.
    ranks: HashTable<(u32, u32)>,
    hasher: rustc_hash::FxBuildHasher,
}

/// Why the encoder could not be built.
#[derive(Debug)]
pub(super) enum LoadError {
    /// The pattern did not compile.
    Pattern(Box<fancy_regex::Error>),
    /// The rank table is cut short.
    Table,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pattern(e) => write!(f, "o200k pattern: {e}"),
            Self::Table => f.write_str("o200k rank table truncated"),
        }
    }
}

impl Counter {
    /// Builds the encoder (tens of ms: one pass over the 1.6 MB table).
    pub(super) fn load() -> Result<Self, LoadError> {
        let regex = Regex::new(PATTERN).map_err(|e| LoadError::Pattern(Box::new(e)))?;
        let starts = starts()?;
        let hasher = rustc_hash::FxBuildHasher;
        let mut ranks = HashTable::with_capacity(starts.len());
        for (rank, &start) in starts.iter().enumerate() {
            let entry = (start, u32::try_from(rank).map_err(|_| LoadError::Table)?);
            ranks.insert_unique(hasher.hash_one(at_start(start)), entry, |&(s, _)| {
                hasher.hash_one(at_start(s))
            });
        }
        Ok(Self {
            regex,
            ranks,
            hasher,
        })
    }

    /// The rank of `bytes`, [`NONE`] if they are no token.
    #[inline]
    fn rank(&self, bytes: &[u8]) -> u32 {
        self.ranks
            .find(self.hasher.hash_one(bytes), |&(s, _)| at_start(s) == bytes)
            .map_or(NONE, |&(_, rank)| rank)
    }

    /// Tokens of `text` (tiktoken `encode_ordinary(text).len()`). Should the pattern give up
    /// (fancy-regex's backtrack limit), the rest counts 1 token per byte: never under.
    pub(super) fn count(&self, text: &str) -> u64 {
        let mut n = 0u64;
        let mut done = 0usize;
        for m in self.regex.find_iter(text) {
            let Ok(m) = m else {
                return n + (text.len() - done) as u64;
            };
            done = m.end();
            let piece = m.as_str().as_bytes();
            n += if piece.len() == 1 || self.rank(piece) != NONE {
                1
            } else if piece.len() < 100 {
                self.merge_small(piece)
            } else {
                self.merge_large(piece)
            };
        }
        n
    }

    /// tiktoken's `_byte_pair_merge`, counting: O(n·m), fast for short pieces.
    fn merge_small(&self, piece: &[u8]) -> u64 {
        // (start, rank of the pair starting there)
        let mut parts: Vec<(usize, u32)> = Vec::with_capacity(piece.len() + 1);
        let mut min = (NONE, usize::MAX);
        for i in 0..piece.len() - 1 {
            let r = self.rank(&piece[i..i + 2]);
            if r < min.0 {
                min = (r, i);
            }
            parts.push((i, r));
        }
        parts.push((piece.len() - 1, NONE));
        parts.push((piece.len(), NONE));
        let pair = |parts: &Vec<(usize, u32)>, i: usize| {
            if i + 3 < parts.len() {
                self.rank(&piece[parts[i].0..parts[i + 3].0])
            } else {
                NONE
            }
        };
        while min.0 != NONE {
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = pair(&parts, i - 1);
            }
            parts[i].1 = pair(&parts, i);
            parts.remove(i + 1);
            min = (NONE, usize::MAX);
            for (i, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
                if r < min.0 {
                    min = (r, i);
                }
            }
        }
        (parts.len() - 1) as u64
    }

    /// tiktoken's `_byte_pair_merge_large`, counting: a heap of candidate merges,
    /// O(n log n) for long pieces (a run of punctuation or a base64 blob).
    fn merge_large(&self, piece: &[u8]) -> u64 {
        struct State {
            prev: usize,
            end: usize,
            next_end: usize,
            next_rank: u32,
        }
        #[derive(PartialEq, Eq)]
        struct Merge {
            start: usize,
            rank: u32,
        }
        impl Ord for Merge {
            // Lowest rank first, then leftmost (BinaryHeap is a max-heap).
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                o.rank
                    .cmp(&self.rank)
                    .then_with(|| o.start.cmp(&self.start))
            }
        }
        impl PartialOrd for Merge {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        let len = piece.len();
        let mut state: Vec<State> = (0..len)
            .map(|i| State {
                prev: i.wrapping_sub(1),
                end: i + 1,
                next_end: i + 2,
                next_rank: NONE,
            })
            .collect();
        let mut heap = BinaryHeap::with_capacity(len);
        for i in 0..len - 1 {
            let r = self.rank(&piece[i..i + 2]);
            if r != NONE {
                heap.push(Merge { start: i, rank: r });
                state[i].next_rank = r;
            }
        }
        let potential =
            |state: &mut Vec<State>, heap: &mut BinaryHeap<Merge>, start: usize, end: usize| {
                state[start].next_end = end;
                state[start].next_rank = NONE;
                if end <= len {
                    let r = self.rank(&piece[start..end]);
                    if r != NONE {
                        heap.push(Merge { start, rank: r });
                        state[start].next_rank = r;
                    }
                }
            };
        let mut merges = 0u64;
        while let Some(left) = heap.pop() {
            if left.rank != state[left.start].next_rank {
                continue; // invalidated by an earlier merge
            }
            let l = left.start;
            let right = state[l].end;
            let right_end = state[l].next_end;
            let right_next_end = state[right].next_end;
            state[l].end = right_end;
            potential(&mut state, &mut heap, l, right_next_end);
            if right_end < len {
                state[right_end].prev = l;
            }
            if l > 0 {
                let prev = state[l].prev;
                potential(&mut state, &mut heap, prev, right_end);
            }
            state[right].next_rank = NONE;
            merges += 1;
        }
        len as u64 - merges
    }
}

/// Where each rank's bytes start in [`TABLE`], in rank order.
fn starts() -> Result<Vec<u32>, LoadError> {
    let mut starts = Vec::with_capacity(200_000);
    let mut at = 0usize;
    while at < TABLE.len() {
        let len = usize::from(TABLE[at]);
        if at + 1 + len > TABLE.len() {
            return Err(LoadError::Table);
        }
        starts.push(u32::try_from(at + 1).map_err(|_| LoadError::Table)?);
        at += 1 + len;
    }
    Ok(starts)
}

/// The token whose bytes start at `at` in [`TABLE`] (its length is the byte before).
#[inline]
fn at_start(at: u32) -> &'static [u8] {
    let at = at as usize;
    &TABLE[at..at + usize::from(TABLE[at - 1])]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Texts of every kind the pattern splits: prose, code, numbers, whitespace runs,
    /// contractions, non-Latin scripts, emoji, long punctuation and base64 runs (the heap path).
    fn corpus() -> Vec<String> {
        let mut c: Vec<String> = [
            "Hello world",
            "",
            " ",
            "  \n\n\t  x",
            "I'm sure they'll say it's fine; we've DONE it, HAVEN'T we?",
            "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
            "1234567890 3.14159 -42 1e10 0x7fff_ffff",
            "Grüße aus Köln! Ça va? ¿Qué tal? Привет, мир! Γειά σου",
            "日本語のテキストです。中文文本。한국어 텍스트",
            "emoji 😀👍🏽🇫🇷 and zwj 👩‍👩‍👧‍👦",
            "مرحبا بالعالم שלום עולם नमस्ते दुनिया",
            "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}",
            "https://example.com/a/b?c=d&e=f#g   trailing   \r\n",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        c.push("=".repeat(5_000));
        c.push("-_".repeat(3_000) + "!?");
        c.push(" ".repeat(1_000) + "x");
        c.push("\n".repeat(300));
        // A pseudo-random base64 blob and random bytes as text: long pieces, rare merges.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut blob = String::new();
        let mut junk = String::new();
        let b64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            blob.push(char::from(b64[(x % 64) as usize]));
            if let Some(ch) = char::from_u32((x % 0x3000) as u32) {
                junk.push(ch);
            }
        }
        c.push(blob);
        c.push(junk);
        c.push(include_str!("mod.rs").to_owned());
        c.push(include_str!("../request.rs").to_owned());
        c
    }

    #[test]
    fn counts_equal_tiktokens() {
        let ours = Counter::load().unwrap();
        let theirs = tiktoken_rs::o200k_base().unwrap();
        for text in corpus() {
            let want = theirs.encode_ordinary(&text).len() as u64;
            assert_eq!(ours.count(&text), want, "{:?}", &text[..text.len().min(60)]);
        }
    }

    #[test]
    fn the_table_is_tiktokens() {
        let ours = Counter::load().unwrap();
        let theirs = tiktoken_rs::o200k_base().unwrap();
        let starts = starts().unwrap();
        assert_eq!(starts.len(), 199_998);
        for (rank, &start) in starts.iter().enumerate() {
            let bytes = at_start(start);
            assert_eq!(theirs.decode_bytes(&[rank as u32]).unwrap(), bytes);
            assert_eq!(ours.rank(bytes), rank as u32);
        }
    }

    /// Writes `o200k_base.bin` from tiktoken-rs:
    /// `cargo test -p switchyard-schemas --features tokens -- --ignored regenerate_the_table`.
    #[test]
    #[ignore = "writes the rank table"]
    fn regenerate_the_table() {
        let theirs = tiktoken_rs::o200k_base().unwrap();
        let mut out = Vec::new();
        let mut rank = 0u32;
        while let Ok(bytes) = theirs.decode_bytes(&[rank]) {
            if rank >= 199_998 {
                break; // the special tokens follow
            }
            out.push(u8::try_from(bytes.len()).unwrap());
            out.extend_from_slice(&bytes);
            rank += 1;
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/tokens/o200k_base.bin");
        std::fs::write(path, out).unwrap();
    }
}
