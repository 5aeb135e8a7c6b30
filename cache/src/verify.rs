//! The verification step: a semantic candidate whose vector is close enough must still agree with
//! the query on every key detail, or it is rejected. Embeddings place "turn on dark mode" and
//! "turn off dark mode" next to each other; these rules do not.
//!
//! Both texts are reduced to [`Features`] and compared rule by rule; the first rule that differs
//! names the rejection ([`Rejection`]). Every rule is deterministic and table-driven, so
//! `switchyard cache eval` can measure it (`--no-verify` shows what the embedding alone does).
//!
//! | rule | what must be equal | examples that are rejected |
//! |---|---|---|
//! | `negation` | whether a negation is present | can / can't · 可以 / 不可以 · 有 / 没有 |
//! | `number` | the multiset of numbers (digits, English number words and ordinals, Chinese numerals) | 2 / 3 · two / 2 people vs 3 · 五个 / 三个 |
//! | `date` | the set of date and time words (months, weekdays, today/tomorrow…, 今天/明天, 周一…) | today / tomorrow · 周一 / 周二 |
//! | `polarity` | the set of poles of opposite pairs (on/off, enable/disable, buy/sell, increase/decrease, 打开/关闭…) | turn on / turn off · 买 / 卖 |
//! | `question` | the specific question type (who, when, where, why, how many/much) | who invented / when was it invented |
//! | `entity` | named entities (capitalised or alphanumeric words, Latin words in Chinese text), in order | Python vs Java · from Paris to London / from London to Paris |
//! | `direction` | how many direction words (to, from, than, into, 到, 从, 比…) precede each shared key word | Celsius to Fahrenheit / Fahrenheit to Celsius |
//! | `key_words` | the set of key words left after stop words, light words and synonyms are removed | book a health check / book a vaccine |
//!
//! Normalisation before the rules: lower case; English contractions (`can't` → `can not`);
//! a light plural stem (`passwords` → `password`); English and Chinese synonym tables map
//! equivalent words to one form (`reset`/`change` stay different, `sign in`/`log in` are one);
//! Chinese text is split into characters after removing function words (怎么, 如何, 请问, 吗…),
//! so a different character is a different key word.

use std::collections::{BTreeMap, BTreeSet};

/// Why a candidate was rejected: the first rule that differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rejection {
    /// One text negates, the other does not.
    Negation,
    /// Different numbers.
    Number,
    /// Different dates or times.
    Date,
    /// Opposite requests (on/off, buy/sell…).
    Polarity,
    /// Different question type (who vs when…).
    Question,
    /// Different named entities, or the same ones in another order.
    Entity,
    /// A shared key word on the other side of a direction word.
    Direction,
    /// Different key words.
    KeyWords,
}

impl Rejection {
    /// Every rule, in the order they are checked.
    pub const ALL: [Rejection; 8] = [
        Self::Negation,
        Self::Number,
        Self::Date,
        Self::Polarity,
        Self::Question,
        Self::Entity,
        Self::Direction,
        Self::KeyWords,
    ];

    /// The rule's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Negation => "negation",
            Self::Number => "number",
            Self::Date => "date",
            Self::Polarity => "polarity",
            Self::Question => "question",
            Self::Entity => "entity",
            Self::Direction => "direction",
            Self::KeyWords => "key_words",
        }
    }
}

/// The key details of one text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Features {
    /// Whether a negation word is present.
    pub negated: bool,
    /// Numbers, normalised (`2`, `2.5`), sorted.
    pub numbers: Vec<String>,
    /// Date and time words, canonical form.
    pub dates: BTreeSet<String>,
    /// `(pair, pole)` of opposite-pair words present, e.g. `("on_off", "+")`.
    pub poles: BTreeSet<(&'static str, char)>,
    /// Specific question types (`who`, `when`, `where`, `why`, `qty`).
    pub questions: BTreeSet<&'static str>,
    /// Named entities in order of appearance, lower case.
    pub entities: Vec<String>,
    /// Key word → how many direction words precede it (its side of `from … to …`).
    pub sides: BTreeMap<String, u8>,
    /// Whether a direction word is present.
    pub directed: bool,
    /// Key words.
    pub keys: BTreeSet<String>,
}

/// Compares two texts; `Ok` when no rule tells them apart.
pub fn verify(a: &str, b: &str) -> Result<(), Rejection> {
    compare(&features(a), &features(b))
}

/// Compares extracted features rule by rule (see the module table).
pub fn compare(a: &Features, b: &Features) -> Result<(), Rejection> {
    let direction = a.directed
        && b.directed
        && a.sides
            .iter()
            .any(|(word, side)| b.sides.get(word).is_some_and(|s| s != side));
    let rules = [
        (a.negated != b.negated, Rejection::Negation),
        (a.numbers != b.numbers, Rejection::Number),
        (a.dates != b.dates, Rejection::Date),
        (a.poles != b.poles, Rejection::Polarity),
        (a.questions != b.questions, Rejection::Question),
        (a.entities != b.entities, Rejection::Entity),
        (direction, Rejection::Direction),
        (a.keys != b.keys, Rejection::KeyWords),
    ];
    match rules.into_iter().find(|(differs, _)| *differs) {
        Some((_, rejection)) => Err(rejection),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Tables: the word lists live in `cache/data/verify.yaml`, compiled to constants by `build.rs`.

include!(concat!(env!("OUT_DIR"), "/verify_tables.rs"));

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF)
}

/// Splits `text` into runs: Latin/digit words and CJK runs, keeping sentence boundaries.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    /// A Latin word as written (case kept), or a number.
    Word(String),
    /// A run of CJK characters.
    Cjk(String),
    /// An operator symbol.
    Sym(char),
    /// End of a sentence (`.`, `?`, `!`, `。`, `？`, `！`).
    Stop,
}

fn pieces(text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut cjk = String::new();
    let flush_word = |word: &mut String, out: &mut Vec<Piece>| {
        if !word.is_empty() {
            let w = word.trim_end_matches(['.', ',', '\'', '-']).to_owned();
            if !w.is_empty() {
                out.push(Piece::Word(w));
            }
            word.clear();
        }
    };
    let flush_cjk = |cjk: &mut String, out: &mut Vec<Piece>| {
        if !cjk.is_empty() {
            out.push(Piece::Cjk(std::mem::take(cjk)));
        }
    };
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let next = chars.get(i + 1).copied();
        if is_cjk(c) {
            flush_word(&mut word, &mut out);
            cjk.push(c);
        } else if c.is_alphanumeric() {
            flush_cjk(&mut cjk, &mut out);
            word.push(c);
        } else if (c == '.' || c == ',')
            && word.chars().last().is_some_and(|p| p.is_ascii_digit())
            && next.is_some_and(|n| n.is_ascii_digit())
        {
            word.push(if c == ',' { '\u{0}' } else { '.' });
        } else if (c == '\'' || c == '’' || c == '-')
            && !word.is_empty()
            && next.is_some_and(char::is_alphanumeric)
        {
            word.push(if c == '-' { '-' } else { '\'' });
        } else {
            flush_word(&mut word, &mut out);
            flush_cjk(&mut cjk, &mut out);
            match c {
                '.' | '?' | '!' | '。' | '？' | '！' | '\n' | ';' | '；' => {
                    out.push(Piece::Stop)
                }
                '+' | '*' | '/' | '=' | '%' | '×' | '÷' | '^' => out.push(Piece::Sym(c)),
                '-' if next.is_some_and(|n| n.is_ascii_digit() || n == ' ') => {
                    out.push(Piece::Sym('-'))
                }
                _ => {}
            }
        }
    }
    flush_word(&mut word, &mut out);
    flush_cjk(&mut cjk, &mut out);
    // Thousands separators (`1,000`) were kept as NUL: drop them.
    for p in &mut out {
        if let Piece::Word(w) = p
            && w.contains('\u{0}')
        {
            *w = w.replace('\u{0}', "");
        }
    }
    out
}

/// Normalises a number written with digits: `007` → `7`, `2.50` → `2.5`.
fn norm_number(s: &str) -> String {
    let s = s.trim_start_matches('0');
    let s = if s.is_empty() || s.starts_with('.') {
        format!("0{s}")
    } else {
        s.to_owned()
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Parses a run of Chinese numerals (`二十五`, `一百零五`, `两万`); `None` if not one.
fn zh_number(run: &str) -> Option<u64> {
    let digit = |c: char| -> Option<u64> {
        Some(match c {
            '零' | '〇' => 0,
            '一' => 1,
            '二' | '两' => 2,
            '三' => 3,
            '四' => 4,
            '五' => 5,
            '六' => 6,
            '七' => 7,
            '八' => 8,
            '九' => 9,
            _ => return None,
        })
    };
    let (mut total, mut section, mut num) = (0u64, 0u64, 0u64);
    let mut any = false;
    for c in run.chars() {
        if let Some(d) = digit(c) {
            num = num.saturating_mul(10).saturating_add(d);
            any = true;
            continue;
        }
        let unit = match c {
            '十' => 10,
            '百' => 100,
            '千' => 1000,
            '万' => 10_000,
            '亿' => 100_000_000,
            _ => return None,
        };
        any = true;
        if unit >= 10_000 {
            total = total.saturating_add((section + num).max(1).saturating_mul(unit));
            section = 0;
        } else {
            section = section.saturating_add(num.max(1).saturating_mul(unit));
        }
        num = 0;
    }
    any.then_some(total + section + num)
}

fn is_zh_numeral(c: char) -> bool {
    "零〇一二两三四五六七八九十百千万亿".contains(c)
}

/// Replaces whole-word occurrences of the `(from, to)` phrases in lower-case, space-joined words.
fn rewrite_phrases(words: &[String], table: &[(&str, &str)]) -> Vec<String> {
    let mut text = format!(" {} ", words.join(" "));
    let mut sorted: Vec<&(&str, &str)> = table.iter().collect();
    sorted.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    for (from, to) in sorted {
        let pat = format!(" {from} ");
        if text.contains(&pat) {
            let rep = if to.is_empty() {
                " ".to_owned()
            } else {
                format!(" {to} ")
            };
            // Twice: adjacent matches share a space, so one pass misses every second one.
            for _ in 0..2 {
                text = text.replace(&pat, &rep);
            }
        }
    }
    text.split_whitespace().map(str::to_owned).collect()
}

fn synonyms() -> &'static std::collections::HashMap<&'static str, &'static str> {
    static MAP: std::sync::OnceLock<std::collections::HashMap<&'static str, &'static str>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        let mut m = std::collections::HashMap::new();
        for (from, to) in EN_SYNONYMS {
            m.entry(*from).or_insert(*to);
        }
        m
    })
}

/// Light English stemming: plurals and possessives.
fn stem(w: &str) -> String {
    if let Some(to) = synonyms().get(w) {
        return (*to).to_owned();
    }
    let w = w.strip_suffix("'s").unwrap_or(w);
    let s = if w.len() > 4 && w.ends_with("ies") {
        format!("{}y", &w[..w.len() - 3])
    } else if w.len() > 4
        && (w.ends_with("ches") || w.ends_with("shes") || w.ends_with("xes") || w.ends_with("sses"))
    {
        w[..w.len() - 2].to_owned()
    } else if w.len() > 3
        && w.ends_with('s')
        && !w.ends_with("ss")
        && !w.ends_with("us")
        && !w.ends_with("is")
    {
        w[..w.len() - 1].to_owned()
    } else {
        w.to_owned()
    };
    match synonyms().get(s.as_str()) {
        Some(to) => (*to).to_owned(),
        None => s,
    }
}

/// Expands English contractions in a lower-case word: `can't` → `can not`.
fn expand_contraction(w: &str, out: &mut Vec<String>) {
    let w = w.replace('’', "'");
    let special = match w.as_str() {
        "can't" | "cannot" => Some(("can", "not")),
        "won't" => Some(("will", "not")),
        "shan't" => Some(("shall", "not")),
        "ain't" => Some(("is", "not")),
        _ => None,
    };
    if let Some((a, b)) = special {
        out.push(a.to_owned());
        out.push(b.to_owned());
        return;
    }
    if let Some(base) = w.strip_suffix("n't") {
        out.push(base.to_owned());
        out.push("not".to_owned());
        return;
    }
    for suffix in ["'re", "'ve", "'ll", "'d", "'m"] {
        if let Some(base) = w.strip_suffix(suffix) {
            out.push(base.to_owned());
            return;
        }
    }
    if let Some(base) = w.strip_suffix("'s") {
        out.push(base.to_owned());
        return;
    }
    out.push(w);
}

/// Extracts the key details of `text`.
pub fn features(text: &str) -> Features {
    let mut f = Features::default();
    // Tokens in reading order: (token, is_key_candidate). Direction words become markers.
    let mut seq: Vec<Tok> = Vec::new();
    let mut sentence_start = true;
    let mut en_words: Vec<(String, bool)> = Vec::new(); // (lower word, was an entity)
    let flush_en = |en_words: &mut Vec<(String, bool)>, seq: &mut Vec<Tok>, f: &mut Features| {
        if en_words.is_empty() {
            return;
        }
        english(std::mem::take(en_words), seq, f);
    };
    for piece in pieces(text) {
        match piece {
            Piece::Stop => {
                flush_en(&mut en_words, &mut seq, &mut f);
                sentence_start = true;
            }
            Piece::Sym(c) => {
                flush_en(&mut en_words, &mut seq, &mut f);
                let c = match c {
                    '×' => '*',
                    '÷' => '/',
                    c => c,
                };
                seq.push(Tok::Key(c.to_string()));
            }
            Piece::Word(w) => {
                let has_digit = w.chars().any(|c| c.is_ascii_digit());
                let has_alpha = w.chars().any(char::is_alphabetic);
                let upper_inside = w.chars().skip(1).any(char::is_uppercase);
                let capital = w.chars().next().is_some_and(char::is_uppercase);
                let entity = (has_digit && has_alpha)
                    || upper_inside
                    || (capital && !sentence_start && w.len() > 1)
                    || (capital
                        && w.len() > 1
                        && w.chars().all(|c| c.is_uppercase() || c.is_ascii_digit()));
                sentence_start = false;
                en_words.push((w.to_lowercase(), entity));
            }
            Piece::Cjk(run) => {
                flush_en(&mut en_words, &mut seq, &mut f);
                chinese(&run, &mut seq, &mut f);
                sentence_start = false;
            }
        }
    }
    flush_en(&mut en_words, &mut seq, &mut f);
    f.numbers.sort();
    // Keys and the number of direction words before them.
    let mut side = 0u8;
    for t in seq {
        match t {
            Tok::Direction => {
                f.directed = true;
                side = side.saturating_add(1);
            }
            Tok::Key(k) => {
                f.sides.entry(k.clone()).or_insert(side);
                f.keys.insert(k);
            }
        }
    }
    f
}

#[derive(Debug)]
enum Tok {
    Key(String),
    Direction,
}

/// English words of one sentence part: `(lower-case word, entity flag)`.
fn english(words: Vec<(String, bool)>, seq: &mut Vec<Tok>, f: &mut Features) {
    let mut entity_words: BTreeSet<String> = BTreeSet::new();
    let mut lower = Vec::new();
    for (w, entity) in words {
        let before = lower.len();
        expand_contraction(&w, &mut lower);
        if entity && lower.len() == before + 1 {
            entity_words.insert(lower[before].clone());
        }
    }
    let words = rewrite_phrases(&lower, EN_PHRASES);
    let mut i = 0;
    while i < words.len() {
        let w = words[i].as_str();
        let next = words.get(i + 1).map(String::as_str);
        // Two-word phrases first: poles and question types.
        if let Some(n) = next {
            let two = format!("{w} {n}");
            if let Some(&(pair, pole, _)) =
                POLES.iter().find(|(_, _, ws)| ws.contains(&two.as_str()))
            {
                f.poles.insert((pair, pole));
                i += 2;
                continue;
            }
            if let Some(&(_, q)) = QUESTIONS.iter().find(|(p, _)| *p == two) {
                f.questions.insert(q);
                i += 2;
                continue;
            }
        }
        i += 1;
        if EN_NEGATION.contains(&w) {
            f.negated = true;
            continue;
        }
        if w.chars().all(|c| c.is_ascii_digit() || c == '.')
            && w.chars().any(|c| c.is_ascii_digit())
        {
            f.numbers.push(norm_number(w));
            continue;
        }
        if let Some(n) = ordinal_digits(w) {
            f.numbers.push(n);
            continue;
        }
        if let Some(&(_, n)) = EN_NUMBERS.iter().find(|(p, _)| *p == w) {
            f.numbers.push(n.to_owned());
            continue;
        }
        let stemmed = stem(w);
        if let Some(&(_, d)) = EN_DATES.iter().find(|(p, _)| *p == stemmed || *p == w) {
            f.dates.insert(d.to_owned());
            continue;
        }
        if let Some(&(_, q)) = QUESTIONS.iter().find(|(p, _)| *p == w) {
            f.questions.insert(q);
            continue;
        }
        if let Some(&(pair, pole, _)) = POLES.iter().find(|(_, _, ws)| ws.contains(&w)) {
            f.poles.insert((pair, pole));
            continue;
        }
        if EN_DIRECTION.contains(&w) {
            seq.push(Tok::Direction);
            continue;
        }
        if w == "+" || w == "-" {
            seq.push(Tok::Key(w.to_owned()));
            continue;
        }
        if entity_words.contains(w) {
            f.entities.push(w.to_owned());
            seq.push(Tok::Key(w.to_owned()));
            continue;
        }
        if EN_STOP.contains(&w) || w.len() < 2 {
            continue;
        }
        seq.push(Tok::Key(stemmed));
    }
}

/// `1st`, `22nd`, `3rd`, `4th` → the number.
fn ordinal_digits(w: &str) -> Option<String> {
    for suffix in ["st", "nd", "rd", "th"] {
        if let Some(n) = w.strip_suffix(suffix)
            && !n.is_empty()
            && n.chars().all(|c| c.is_ascii_digit())
        {
            return Some(norm_number(n));
        }
    }
    None
}

/// One run of CJK characters.
fn chinese(run: &str, seq: &mut Vec<Tok>, f: &mut Features) {
    let mut text = run.to_owned();
    // Words whose negation character is not a negation.
    for (from, to) in ZH_NOT_NEGATION {
        text = text.replace(from, to);
    }
    // Question types, dates and poles are matched before synonyms rewrite the text.
    let taken = |text: &mut String, table: &[(&str, &str)], mut on: Box<dyn FnMut(&str) + '_>| {
        let mut sorted: Vec<&(&str, &str)> = table.iter().collect();
        sorted.sort_by_key(|(from, _)| std::cmp::Reverse(from.chars().count()));
        for (from, to) in sorted {
            if text.contains(from) {
                on(to);
                *text = text.replace(from, " ");
            }
        }
    };
    taken(
        &mut text,
        QUESTIONS,
        Box::new(|q| {
            if let Some(&(_, q)) = QUESTIONS.iter().find(|(_, v)| *v == q) {
                f.questions.insert(q);
            }
        }),
    );
    let mut dates = BTreeSet::new();
    taken(
        &mut text,
        ZH_DATES,
        Box::new(|d| {
            dates.insert(d.to_owned());
        }),
    );
    f.dates.extend(dates);
    // Opposite pairs (longest words first).
    let mut zh_poles: Vec<(&str, &'static str, char)> = POLES
        .iter()
        .flat_map(|(pair, pole, ws)| {
            ws.iter()
                .filter(|w| w.chars().any(is_cjk))
                .map(move |w| (*w, *pair, *pole))
        })
        .collect();
    zh_poles.sort_by_key(|(w, _, _)| std::cmp::Reverse(w.chars().count()));
    // Negation first, so that 不连 or 不开 negate without opening a pole on their own.
    if text.chars().any(|c| ZH_NEGATION.contains(&c)) {
        f.negated = true;
        text = text.chars().filter(|c| !ZH_NEGATION.contains(c)).collect();
    }
    for (w, pair, pole) in zh_poles {
        if text.contains(w) {
            f.poles.insert((pair, pole));
            text = text.replace(w, " ");
        }
    }
    // Multi-character function words (一个 before numerals are read).
    let mut stops: Vec<&&str> = ZH_STOP.iter().filter(|w| w.chars().count() > 1).collect();
    stops.sort_by_key(|w| std::cmp::Reverse(w.chars().count()));
    for w in stops {
        text = text.replace(*w, " ");
    }
    // Synonyms and function words.
    // Canonical forms map to themselves too, so a text already using one reads the same.
    let identities: Vec<(&str, &str)> = ZH_PHRASES
        .iter()
        .filter(|(_, to)| to.chars().count() > 1 && to.chars().all(is_cjk))
        .map(|(_, to)| (*to, *to))
        .collect();
    let mut phrases: Vec<&(&str, &str)> = ZH_PHRASES.iter().chain(identities.iter()).collect();
    phrases.sort_by_key(|(from, _)| std::cmp::Reverse(from.chars().count()));
    for (from, to) in phrases {
        if text.contains(from) {
            // Mark rewritten words so their characters stay one key.
            let rep = if to.is_empty() {
                " ".to_owned()
            } else {
                format!(" \u{1}{to} ")
            };
            text = text.replace(from, &rep);
        }
    }
    // Direction words.
    let mut dir_sorted: Vec<&&str> = ZH_DIRECTION.iter().collect();
    dir_sorted.sort_by_key(|w| std::cmp::Reverse(w.chars().count()));
    for w in dir_sorted {
        text = text.replace(*w, " \u{2} ");
    }
    for part in text.split_whitespace() {
        if part == "\u{2}" {
            seq.push(Tok::Direction);
            continue;
        }
        if let Some(word) = part.strip_prefix('\u{1}') {
            // Canonical words are split like any other text, so both sides agree.
            if word.chars().any(is_cjk) {
                seq.extend(word.chars().map(|c| Tok::Key(c.to_string())));
            } else {
                seq.push(Tok::Key(word.to_owned()));
            }
            continue;
        }
        // Numbers: runs of numerals (一 inside words like 一下 was rewritten above).
        let chars: Vec<char> = part.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if is_zh_numeral(chars[i]) {
                let start = i;
                while i < chars.len() && is_zh_numeral(chars[i]) {
                    i += 1;
                }
                let run: String = chars[start..i].iter().collect();
                if let Some(n) = zh_number(&run) {
                    f.numbers.push(n.to_string());
                }
                continue;
            }
            let c = chars[i];
            i += 1;
            let s = c.to_string();
            if ZH_STOP.contains(&s.as_str()) {
                continue;
            }
            seq.push(Tok::Key(s));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn rejects(a: &str, b: &str) -> Rejection {
        match verify(a, b) {
            Err(r) => r,
            Ok(()) => panic!("`{a}` vs `{b}` passed verification"),
        }
    }

    fn passes(a: &str, b: &str) {
        assert_eq!(
            verify(a, b),
            Ok(()),
            "`{a}` vs `{b}`\n{:?}\n{:?}",
            features(a),
            features(b)
        );
    }

    #[test]
    fn fc25_on_off_and_unrelated() {
        assert_eq!(
            rejects(
                "How do I turn on dark mode?",
                "How do I turn off dark mode?"
            ),
            Rejection::Polarity
        );
        assert!(verify("Hello world", "What is 1+1?").is_err());
        passes("How do I turn on dark mode?", "How can I enable dark mode?");
    }

    #[test]
    fn english_rules() {
        assert_eq!(
            rejects("Can I return a used item?", "Can't I return a used item?"),
            Rejection::Negation
        );
        assert_eq!(rejects("What is 2+2?", "What is 3+3?"), Rejection::Number);
        assert_eq!(
            rejects("Book a table for two", "Book a table for 3"),
            Rejection::Number
        );
        passes("Book a table for two", "Book a table for 2");
        assert_eq!(
            rejects("What's the weather today?", "What's the weather tomorrow?"),
            Rejection::Date
        );
        assert_eq!(
            rejects(
                "Who invented the telephone?",
                "When was the telephone invented?"
            ),
            Rejection::Question
        );
        assert_eq!(
            rejects("Is Python faster than Java?", "Is Java faster than Python?"),
            Rejection::Entity
        );
        assert_eq!(
            rejects(
                "Convert celsius to fahrenheit",
                "Convert fahrenheit to celsius"
            ),
            Rejection::Direction
        );
        assert_eq!(
            rejects("How do I book a health check?", "How do I book a vaccine?"),
            Rejection::KeyWords
        );
        passes(
            "How do I reset my password?",
            "How can I reset my passwords?",
        );
        passes(
            "What is the capital of France?",
            "Which city is the capital of France?",
        );
        passes(
            "I forgot my password, what do I do?",
            "How do I reset my password?",
        );
    }

    #[test]
    fn chinese_rules() {
        assert_eq!(
            rejects("如何打开深色模式", "如何关闭深色模式"),
            Rejection::Polarity
        );
        assert_eq!(rejects("可以退货吗", "不可以退货吗"), Rejection::Negation);
        assert_eq!(rejects("我有发票", "我没有发票"), Rejection::Negation);
        assert_eq!(rejects("买三个苹果", "买五个苹果"), Rejection::Number);
        passes("买3个苹果", "买三个苹果");
        assert_eq!(
            rejects("北京今天天气怎么样", "北京明天天气怎么样"),
            Rejection::Date
        );
        assert_eq!(
            rejects("北京天气怎么样", "上海天气怎么样"),
            Rejection::KeyWords
        );
        assert_eq!(rejects("如何预约体检", "如何预约疫苗"), Rejection::KeyWords);
        passes("怎么重置密码", "如何重设密码");
        passes("请问怎么修改密码", "密码如何更改");
        assert_eq!(zh_number("二十五"), Some(25));
        assert_eq!(zh_number("一百零五"), Some(105));
        assert_eq!(zh_number("两万"), Some(20_000));
        assert_eq!(zh_number("十"), Some(10));
        passes("帮我查一下天气", "查天气");
    }

    #[test]
    fn numbers_normalise() {
        assert_eq!(features("costs 1,000 or 2.50").numbers, vec!["1000", "2.5"]);
        assert_eq!(features("the 3rd and first").numbers, vec!["1", "3"]);
    }
}
