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
    if a.negated != b.negated {
        return Err(Rejection::Negation);
    }
    if a.numbers != b.numbers {
        return Err(Rejection::Number);
    }
    if a.dates != b.dates {
        return Err(Rejection::Date);
    }
    if a.poles != b.poles {
        return Err(Rejection::Polarity);
    }
    if a.questions != b.questions {
        return Err(Rejection::Question);
    }
    if a.entities != b.entities {
        return Err(Rejection::Entity);
    }
    if a.directed && b.directed {
        for (word, side) in &a.sides {
            if b.sides.get(word).is_some_and(|s| s != side) {
                return Err(Rejection::Direction);
            }
        }
    }
    if a.keys != b.keys {
        return Err(Rejection::KeyWords);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tables

/// English negation words (after contractions are split: `n't` → `not`).
const EN_NEGATION: &[&str] = &[
    "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "unable",
    "cannot", "nowhere", "stop", "stopped", "avoid", "prevent", "fail", "fails", "failed",
];

/// Chinese words whose 不/没/无/未/别/非/否 is not a negation, mapped to a neutral form.
const ZH_NOT_NEGATION: &[(&str, &str)] = &[
    ("不错", "好"),
    ("不过", "但"),
    ("不仅", "且"),
    ("不断", "持续"),
    ("不少", "多"),
    ("不久", "快"),
    ("差不多", "约"),
    ("了不起", "强"),
    ("不同", "异"),
    ("无线", "wifi"),
    ("无论", "任"),
    ("未来", "将来"),
    ("别人", "他人"),
    ("区别", "差异"),
    ("特别", "特"),
    ("类别", "类"),
    ("级别", "级"),
    ("识别", "认出"),
    ("分别", "各"),
    ("非常", "很"),
    ("是否", ""),
    ("能否", "能"),
    ("可否", "能"),
    ("要不要", "要"),
    ("能不能", "能"),
    ("可不可以", "可以"),
    ("会不会", "会"),
    ("是不是", ""),
    ("有没有", "有"),
    ("对不对", ""),
    ("好不好", ""),
    ("行不行", ""),
];

/// Chinese negation characters.
const ZH_NEGATION: &[char] = &['不', '没', '无', '未', '别', '非', '勿', '莫', '否'];

/// English number words.
const EN_NUMBERS: &[(&str, &str)] = &[
    ("zero", "0"),
    ("one", "1"),
    ("two", "2"),
    ("three", "3"),
    ("four", "4"),
    ("five", "5"),
    ("six", "6"),
    ("seven", "7"),
    ("eight", "8"),
    ("nine", "9"),
    ("ten", "10"),
    ("eleven", "11"),
    ("twelve", "12"),
    ("thirteen", "13"),
    ("fourteen", "14"),
    ("fifteen", "15"),
    ("sixteen", "16"),
    ("seventeen", "17"),
    ("eighteen", "18"),
    ("nineteen", "19"),
    ("twenty", "20"),
    ("thirty", "30"),
    ("forty", "40"),
    ("fifty", "50"),
    ("sixty", "60"),
    ("seventy", "70"),
    ("eighty", "80"),
    ("ninety", "90"),
    ("hundred", "100"),
    ("thousand", "1000"),
    ("million", "1000000"),
    ("billion", "1000000000"),
    ("dozen", "12"),
    ("half", "0.5"),
    ("twice", "2"),
    ("double", "2"),
    ("triple", "3"),
    ("first", "1"),
    ("second", "2"),
    ("third", "3"),
    ("fourth", "4"),
    ("fifth", "5"),
    ("sixth", "6"),
    ("seventh", "7"),
    ("eighth", "8"),
    ("ninth", "9"),
    ("tenth", "10"),
    ("last", "-1"),
];

/// English date and time words → canonical form.
const EN_DATES: &[(&str, &str)] = &[
    ("today", "d0"),
    ("tonight", "d0n"),
    ("tomorrow", "d+1"),
    ("yesterday", "d-1"),
    ("now", "now"),
    ("currently", "now"),
    ("morning", "am"),
    ("afternoon", "pm"),
    ("evening", "eve"),
    ("night", "night"),
    ("weekend", "weekend"),
    ("weekday", "weekday"),
    ("monday", "mon"),
    ("tuesday", "tue"),
    ("wednesday", "wed"),
    ("thursday", "thu"),
    ("friday", "fri"),
    ("saturday", "sat"),
    ("sunday", "sun"),
    ("january", "jan"),
    ("february", "feb"),
    ("march", "mar"),
    ("april", "apr"),
    ("may", "may"),
    ("june", "jun"),
    ("july", "jul"),
    ("august", "aug"),
    ("september", "sep"),
    ("october", "oct"),
    ("november", "nov"),
    ("december", "dec"),
    ("week", "week"),
    ("month", "month"),
    ("year", "year"),
    ("annual", "year"),
    ("yearly", "year"),
    ("monthly", "month"),
    ("weekly", "week"),
    ("daily", "day"),
    ("day", "day"),
    ("hour", "hour"),
    ("hourly", "hour"),
    ("minute", "minute"),
    ("spring", "spring"),
    ("summer", "summer"),
    ("autumn", "autumn"),
    ("fall", "autumn"),
    ("winter", "winter"),
];

/// Chinese date and time words → canonical form (longest first when matched).
const ZH_DATES: &[(&str, &str)] = &[
    ("今天", "d0"),
    ("今日", "d0"),
    ("今晚", "d0n"),
    ("明天", "d+1"),
    ("明日", "d+1"),
    ("后天", "d+2"),
    ("昨天", "d-1"),
    ("昨日", "d-1"),
    ("前天", "d-2"),
    ("现在", "now"),
    ("目前", "now"),
    ("早上", "am"),
    ("上午", "am"),
    ("下午", "pm"),
    ("晚上", "eve"),
    ("周末", "weekend"),
    ("工作日", "weekday"),
    ("星期一", "mon"),
    ("星期二", "tue"),
    ("星期三", "wed"),
    ("星期四", "thu"),
    ("星期五", "fri"),
    ("星期六", "sat"),
    ("星期日", "sun"),
    ("星期天", "sun"),
    ("周一", "mon"),
    ("周二", "tue"),
    ("周三", "wed"),
    ("周四", "thu"),
    ("周五", "fri"),
    ("周六", "sat"),
    ("周日", "sun"),
    ("今年", "y0"),
    ("明年", "y+1"),
    ("去年", "y-1"),
    ("本周", "w0"),
    ("这周", "w0"),
    ("下周", "w+1"),
    ("上周", "w-1"),
    ("本月", "m0"),
    ("这个月", "m0"),
    ("下个月", "m+1"),
    ("上个月", "m-1"),
    ("春天", "spring"),
    ("夏天", "summer"),
    ("秋天", "autumn"),
    ("冬天", "winter"),
];

/// Opposite pairs: (pair name, pole, words). English entries may be two words (`turn on`).
const POLES: &[(&str, char, &[&str])] = &[
    (
        "on_off",
        '+',
        &[
            "turn on",
            "switch on",
            "power on",
            "enable",
            "enabled",
            "activate",
            "打开",
            "开启",
            "启用",
            "开通",
            "激活",
        ],
    ),
    (
        "on_off",
        '-',
        &[
            "turn off",
            "switch off",
            "power off",
            "off",
            "disable",
            "disabled",
            "deactivate",
            "shut down",
            "关闭",
            "关掉",
            "停用",
            "禁用",
            "关机",
        ],
    ),
    (
        "in_out",
        '+',
        &[
            "log in", "sign in", "login", "signin", "check in", "opt in", "登录", "登陆", "登入",
        ],
    ),
    (
        "in_out",
        '-',
        &[
            "log out",
            "sign out",
            "logout",
            "signout",
            "check out",
            "opt out",
            "退出登录",
            "退出登陆",
            "退出",
            "登出",
            "注销",
        ],
    ),
    (
        "up_down",
        '+',
        &[
            "increase", "raise", "up", "upgrade", "more", "higher", "maximum", "max", "largest",
            "biggest", "highest", "增加", "提高", "升级", "调高", "最大", "最高", "更多", "增大",
            "加大",
        ],
    ),
    (
        "up_down",
        '-',
        &[
            "decrease",
            "reduce",
            "lower",
            "down",
            "downgrade",
            "less",
            "fewer",
            "minimum",
            "min",
            "smallest",
            "lowest",
            "减少",
            "降低",
            "降级",
            "调低",
            "最小",
            "最低",
            "更少",
            "减小",
        ],
    ),
    ("buy_sell", '+', &["buy", "purchase", "购买", "买"]),
    ("buy_sell", '-', &["sell", "出售", "卖"]),
    (
        "add_remove",
        '+',
        &[
            "add",
            "create",
            "install",
            "insert",
            "subscribe",
            "join",
            "添加",
            "创建",
            "安装",
            "订阅",
            "加入",
            "新建",
        ],
    ),
    (
        "add_remove",
        '-',
        &[
            "remove",
            "delete",
            "uninstall",
            "unsubscribe",
            "leave",
            "cancel",
            "删除",
            "移除",
            "卸载",
            "退订",
            "取消",
        ],
    ),
    (
        "lock",
        '+',
        &[
            "lock", "encrypt", "block", "hide", "锁定", "加密", "屏蔽", "隐藏", "拉黑",
        ],
    ),
    (
        "lock",
        '-',
        &[
            "unlock",
            "decrypt",
            "unblock",
            "show",
            "解锁",
            "解密",
            "解除屏蔽",
            "显示",
        ],
    ),
    (
        "load",
        '+',
        &["upload", "import", "send", "上传", "导入", "发送"],
    ),
    (
        "load",
        '-',
        &["download", "export", "receive", "下载", "导出", "接收"],
    ),
    ("start_stop", '+', &["start", "begin", "开始", "启动"]),
    ("start_stop", '-', &["end", "finish", "结束", "停止"]),
    ("time_order", '+', &["before", "earlier", "之前", "以前"]),
    ("time_order", '-', &["after", "later", "之后", "以后"]),
    (
        "good_bad",
        '+',
        &["pros", "advantage", "benefit", "优点", "好处"],
    ),
    (
        "good_bad",
        '-',
        &[
            "cons",
            "disadvantage",
            "drawback",
            "risk",
            "缺点",
            "坏处",
            "风险",
        ],
    ),
    ("open_close", '+', &["open", "开"]),
    ("open_close", '-', &["close", "关"]),
    ("hot_cold", '+', &["hot", "warm", "heat", "热", "暖"]),
    ("hot_cold", '-', &["cold", "cool", "freeze", "冷", "凉"]),
    ("fast_slow", '+', &["fast", "faster", "quick", "快"]),
    ("fast_slow", '-', &["slow", "slower", "慢"]),
    ("left_right", '+', &["left", "左"]),
    ("left_right", '-', &["right", "右"]),
    (
        "accept",
        '+',
        &["accept", "approve", "allow", "接受", "批准", "允许"],
    ),
    (
        "accept",
        '-',
        &["reject", "decline", "deny", "refuse", "拒绝", "驳回"],
    ),
    ("in_ex", '+', &["include", "including", "包含", "包括"]),
    ("in_ex", '-', &["exclude", "excluding", "排除", "不含"]),
    ("borrow", '+', &["borrow", "借入"]),
    ("borrow", '-', &["lend", "借出"]),
    ("win", '+', &["win", "won", "赢"]),
    ("win", '-', &["lose", "lost", "输"]),
];

/// Specific question types (what/which/how are generic and ignored).
const QUESTIONS: &[(&str, &str)] = &[
    ("who", "who"),
    ("whom", "who"),
    ("whose", "who"),
    ("when", "when"),
    ("where", "where"),
    ("why", "why"),
    ("how many", "qty"),
    ("how much", "qty"),
    ("how long", "qty"),
    ("how old", "qty"),
    ("how far", "qty"),
    ("how big", "qty"),
    ("how often", "qty"),
    ("谁", "who"),
    ("什么时候", "when"),
    ("何时", "when"),
    ("几点", "when"),
    ("哪天", "when"),
    ("哪里", "where"),
    ("哪儿", "where"),
    ("在哪", "where"),
    ("何处", "where"),
    ("为什么", "why"),
    ("为何", "why"),
    ("多少", "qty"),
    ("几个", "qty"),
    ("多久", "qty"),
    ("多长", "qty"),
    ("多大", "qty"),
    ("多远", "qty"),
    ("多高", "qty"),
    ("几岁", "qty"),
    ("几", "qty"),
];

/// Direction words: a shared key word must stay on its side of the first one.
const EN_DIRECTION: &[&str] = &[
    "to", "into", "from", "than", "vs", "versus", "over", "against",
];
const ZH_DIRECTION: &[&str] = &[
    "转换成",
    "转换为",
    "换成",
    "转成",
    "转为",
    "变成",
    "到",
    "从",
    "比",
    "成",
];

/// English synonyms → one form (single words; phrases are in [`EN_PHRASES`]).
const EN_SYNONYMS: &[(&str, &str)] = &[
    ("modify", "change"),
    ("alter", "change"),
    ("update", "change"),
    ("edit", "change"),
    ("amend", "change"),
    ("reach", "contact"),
    ("percent", "%"),
    ("percentage", "%"),
    ("recover", "reset"),
    ("restore", "reset"),
    ("retrieve", "reset"),
    ("forgot", "reset"),
    ("forgotten", "reset"),
    ("passcode", "password"),
    ("pwd", "password"),
    ("e-mail", "email"),
    ("mail", "email"),
    ("cellphone", "phone"),
    ("smartphone", "phone"),
    ("mobile", "phone"),
    ("telephone", "phone"),
    ("photo", "picture"),
    ("image", "picture"),
    ("pic", "picture"),
    ("film", "movie"),
    ("automobile", "car"),
    ("vehicle", "car"),
    ("begin", "start"),
    ("commence", "start"),
    ("halt", "end"),
    ("terminate", "end"),
    ("quit", "exit"),
    ("locate", "find"),
    ("discover", "find"),
    ("search", "find"),
    ("lookup", "find"),
    ("purchase", "buy"),
    ("obtain", "get"),
    ("acquire", "get"),
    ("receive", "get"),
    ("assist", "help"),
    ("aid", "help"),
    ("large", "big"),
    ("huge", "big"),
    ("tiny", "small"),
    ("little", "small"),
    ("quick", "fast"),
    ("rapid", "fast"),
    ("speedy", "fast"),
    ("error", "problem"),
    ("issue", "problem"),
    ("trouble", "problem"),
    ("bug", "problem"),
    ("fix", "solve"),
    ("resolve", "solve"),
    ("repair", "solve"),
    ("refund", "refund"),
    ("reimbursement", "refund"),
    ("price", "cost"),
    ("charge", "cost"),
    ("fee", "cost"),
    ("expense", "cost"),
    ("signup", "register"),
    ("enroll", "register"),
    ("enrol", "register"),
    ("schedule", "book"),
    ("reserve", "book"),
    ("reservation", "book"),
    ("booking", "book"),
    ("appointment", "book"),
    ("setup", "configure"),
    ("config", "configure"),
    ("configuration", "configure"),
    ("settings", "setting"),
    ("preferences", "setting"),
    ("options", "setting"),
    ("application", "app"),
    ("program", "app"),
    ("software", "app"),
    ("computer", "pc"),
    ("laptop", "laptop"),
    ("notebook", "laptop"),
    ("connect", "connect"),
    ("link", "connect"),
    ("pair", "connect"),
    ("wireless", "wifi"),
    ("wi-fi", "wifi"),
    ("internet", "wifi"),
    ("network", "wifi"),
    ("capital", "capital"),
    ("nation", "country"),
    ("colour", "color"),
    ("favourite", "favorite"),
    ("centre", "center"),
    ("recipe", "cook"),
    ("cooking", "cook"),
    ("bake", "cook"),
    ("prepare", "cook"),
    ("make", "make"),
    ("invented", "invent"),
    ("inventor", "invent"),
    ("created", "invent"),
    ("wrote", "write"),
    ("written", "write"),
    ("writer", "write"),
    ("author", "write"),
    ("tall", "height"),
    ("high", "height"),
    ("old", "age"),
    ("born", "birth"),
    ("die", "death"),
    ("died", "death"),
    ("dead", "death"),
    ("located", "location"),
    ("situated", "location"),
    ("translate", "translate"),
    ("translation", "translate"),
    ("say", "translate"),
    ("shipping", "delivery"),
    ("ship", "delivery"),
    ("deliver", "delivery"),
    ("shipment", "delivery"),
    ("parcel", "package"),
    ("order", "order"),
    ("cancellation", "cancel"),
    ("cancelled", "cancel"),
    ("canceled", "cancel"),
    ("invoices", "invoice"),
    ("bill", "invoice"),
    ("receipt", "invoice"),
    ("subscription", "subscribe"),
    ("plan", "subscribe"),
    ("membership", "subscribe"),
    ("weather", "weather"),
    ("forecast", "weather"),
    ("temperature", "weather"),
    ("calculate", "compute"),
    ("compute", "compute"),
    ("sum", "plus"),
    ("add", "add"),
    ("multiplied", "times"),
    ("multiply", "times"),
    ("divided", "divide"),
    ("biggest", "largest"),
    ("greatest", "largest"),
    ("planet", "planet"),
    ("ocean", "ocean"),
    ("sea", "sea"),
    ("doctor", "doctor"),
    ("physician", "doctor"),
    ("sick", "ill"),
    ("illness", "ill"),
    ("disease", "ill"),
    ("medicine", "drug"),
    ("medication", "drug"),
    ("pill", "drug"),
    ("kid", "child"),
    ("children", "child"),
    ("kids", "child"),
    ("people", "person"),
    ("persons", "person"),
    ("men", "man"),
    ("women", "woman"),
    ("feet", "foot"),
    ("teeth", "tooth"),
    ("mice", "mouse"),
    ("utilize", "use"),
    ("using", "use"),
    ("used", "use"),
    ("uses", "use"),
    ("employ", "use"),
    ("shows", "show"),
    ("showing", "show"),
    ("stopping", "stop"),
    ("turning", "turn"),
    ("resetting", "reset"),
    ("changing", "change"),
    ("changed", "change"),
    ("deleting", "delete"),
    ("deleted", "delete"),
    ("removing", "remove"),
    ("removed", "remove"),
    ("installing", "install"),
    ("installed", "install"),
    ("working", "work"),
    ("worked", "work"),
    ("works", "work"),
    ("function", "work"),
    ("functioning", "work"),
    ("operate", "work"),
    ("running", "run"),
    ("ran", "run"),
    ("runs", "run"),
    ("finding", "find"),
    ("found", "find"),
    ("getting", "get"),
    ("got", "get"),
    ("gets", "get"),
    ("making", "make"),
    ("made", "make"),
    ("makes", "make"),
    ("writing", "write"),
    ("booking", "book"),
    ("booked", "book"),
    ("connecting", "connect"),
    ("connected", "connect"),
    ("opening", "open"),
    ("opened", "open"),
    ("closing", "close"),
    ("closed", "close"),
    ("learning", "learn"),
    ("learned", "learn"),
    ("study", "learn"),
    ("studying", "learn"),
    ("mandarin", "chinese"),
    ("usa", "us"),
    ("america", "us"),
    ("uk", "britain"),
    ("england", "britain"),
];

/// English phrases rewritten before tokenising (lower case, whole-word match).
const EN_PHRASES: &[(&str, &str)] = &[
    ("log on", "log in"),
    ("sign on", "log in"),
    ("sign in", "log in"),
    ("signin", "log in"),
    ("login", "log in"),
    ("log into", "log in to"),
    ("sign into", "log in to"),
    ("sign out", "log out"),
    ("signout", "log out"),
    ("logout", "log out"),
    ("sign up", "register"),
    ("set up", "configure"),
    ("switch on", "turn on"),
    ("power on", "turn on"),
    ("switch off", "turn off"),
    ("power off", "turn off"),
    ("shut off", "turn off"),
    ("shut down", "turn off"),
    ("figure out", "find"),
    ("find out", "find"),
    ("look up", "find"),
    ("look for", "find"),
    ("get rid of", "remove"),
    ("get back", "reset"),
    ("dark theme", "dark mode"),
    ("night mode", "dark mode"),
    ("light theme", "light mode"),
    ("e mail", "email"),
    ("wi fi", "wifi"),
    ("cell phone", "phone"),
    ("mobile phone", "phone"),
    ("united states", "us"),
    ("united kingdom", "britain"),
    ("great britain", "britain"),
    ("new york", "newyork"),
    ("san francisco", "sanfrancisco"),
    ("los angeles", "losangeles"),
    ("hong kong", "hongkong"),
    ("how come", "why"),
    ("what time", "when"),
    ("what year", "when"),
    ("what date", "when"),
    ("which year", "when"),
    ("in which year", "when"),
    ("what is the reason", "why"),
    ("what is the number of", "how many"),
    ("what number of", "how many"),
    ("what is the cost", "how much"),
    ("what does it cost", "how much"),
    ("what place", "where"),
    ("which person", "who"),
    ("multiplied by", "times"),
    ("divided by", "divide"),
    ("plus", "+"),
    ("minus", "-"),
    ("at the moment", "now"),
    ("right now", "now"),
    ("a lot of", "many"),
    ("lots of", "many"),
    ("in order to", "to"),
    ("is it possible to", "can"),
    ("is there a way to", "can"),
    ("are you able to", "can"),
    ("do you know", ""),
    ("could you tell me", ""),
    ("can you tell me", ""),
    ("tell me", ""),
    ("i would like to", ""),
    ("i'd like to", ""),
    ("i want to", ""),
    ("i need to", ""),
    ("what's the best way to", "how to"),
    ("what is the best way to", "how to"),
    ("what is the way to", "how to"),
    ("what are the steps to", "how to"),
    ("steps to", "how to"),
    ("the process of", ""),
    ("instructions for", "how to"),
];

/// English words that carry no key detail (function words, light verbs, politeness, generic nouns).
const EN_STOP: &[&str] = &[
    "a",
    "an",
    "the",
    "this",
    "that",
    "these",
    "those",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "am",
    "do",
    "does",
    "did",
    "doing",
    "done",
    "have",
    "has",
    "had",
    "having",
    "i",
    "me",
    "my",
    "mine",
    "myself",
    "you",
    "your",
    "yours",
    "we",
    "us_",
    "our",
    "ours",
    "they",
    "them",
    "their",
    "it",
    "its",
    "he",
    "him",
    "his",
    "she",
    "her",
    "hers",
    "what",
    "which",
    "how",
    "whats",
    "hows",
    "whos",
    "can",
    "could",
    "would",
    "should",
    "shall",
    "will",
    "may_",
    "might",
    "must",
    "need",
    "needs",
    "want",
    "wants",
    "wanna",
    "like",
    "please",
    "kindly",
    "help",
    "tell",
    "know",
    "let",
    "lets",
    "of",
    "in",
    "on",
    "at",
    "by",
    "for",
    "with",
    "about",
    "as",
    "and",
    "or",
    "but",
    "if",
    "so",
    "then",
    "there",
    "here",
    "some",
    "any",
    "all",
    "each",
    "every",
    "just",
    "also",
    "too",
    "very",
    "really",
    "quite",
    "exactly",
    "actually",
    "basically",
    "way",
    "ways",
    "method",
    "steps",
    "step",
    "process",
    "thing",
    "things",
    "something",
    "anything",
    "way",
    "best",
    "proper",
    "correct",
    "right_",
    "good",
    "easy",
    "easiest",
    "simple",
    "quickly",
    "possible",
    "able",
    "hey",
    "hi",
    "hello",
    "thanks",
    "thank",
    "question",
    "ask",
    "asking",
    "wondering",
    "curious",
    "idea",
    "info",
    "information",
    "details",
    "detail",
    "guide",
    "instructions",
    "instruction",
    "tutorial",
    "procedure",
    "to",
    "go",
    "going",
    "get",
    "give",
    "show_",
    "explain_",
    "out",
    "up_",
    "again",
    "currently_",
    "one_",
    "own",
    "via",
    "using_",
    "where_",
    "kind",
    "type",
    "sort",
    "much_",
    "many_",
    "exist",
    "exists",
    "called",
    "named",
    "name",
    "term",
    "word",
    "mean_",
    "example",
    "me_",
    "someone",
    "somebody",
    "anyone",
    "ever",
    "already",
    "still",
    "yet",
    "even",
    "maybe",
    "perhaps",
    "okay",
    "ok",
    "sure",
    "well",
    "else",
    "other",
    "another",
    "such",
    "into_",
    "onto",
    "upon",
    "within",
    "between",
    "among",
    "through",
    "during",
    "while",
    "because",
    "since",
    "until",
    "till",
    "does",
    "doesnt",
    "dont",
    "didnt",
    "im",
    "ive",
    "id",
    "ill_",
    "youre",
    "theyre",
    "were_",
    "theres",
    "thats",
    "whats",
    "try",
    "trying",
    "attempt",
    "manage",
    "happen",
    "happens",
    "work_",
    "definitely",
    "find_",
    "city",
    "place",
    "country_",
    "people_",
    "person_",
    "thing_",
    "stuff",
    "currently__",
    "mode_",
    "explain",
    "describe",
    "define",
    "definition",
    "meaning",
    "mean",
    "summarize",
    "summary",
    "overview",
    "located",
    "situated",
    "offer",
    "provide",
    "available",
];

/// Chinese synonyms and multi-character words → one form, applied before splitting.
const ZH_PHRASES: &[(&str, &str)] = &[
    ("如何", ""),
    ("怎么样", ""),
    ("怎样", ""),
    ("怎么", ""),
    ("请问", ""),
    ("麻烦", ""),
    ("帮我", ""),
    ("帮忙", ""),
    ("给我", ""),
    ("告诉我", ""),
    ("一下", ""),
    ("一些", ""),
    ("一点", ""),
    ("有点", ""),
    ("一起", ""),
    ("一样", "同"),
    ("一直", "持续"),
    ("一定", ""),
    ("一般", "通常"),
    ("一切", "全"),
    ("统一", "统"),
    ("唯一", "独"),
    ("我想", ""),
    ("我要", ""),
    ("想要", ""),
    ("需要", ""),
    ("可以", ""),
    ("能够", ""),
    ("应该", ""),
    ("应当", ""),
    ("是什么", ""),
    ("什么是", ""),
    ("什么", ""),
    ("哪个", ""),
    ("哪些", ""),
    ("方法", ""),
    ("办法", ""),
    ("步骤", ""),
    ("操作", ""),
    ("流程", ""),
    ("重设", "重置"),
    ("找回", "重置"),
    ("忘记", "重置"),
    ("忘了", "重置"),
    ("修改", "改"),
    ("更改", "改"),
    ("改变", "改"),
    ("变更", "改"),
    ("换掉", "改"),
    ("查看", "查"),
    ("查询", "查"),
    ("检查", "查"),
    ("清除", "清"),
    ("清理", "清"),
    ("清空", "清"),
    ("开具", "开"),
    ("申请", ""),
    ("钱", "价格"),
    ("长度", "长"),
    ("口令", "密码"),
    ("手机号码", "手机号"),
    ("电话号码", "手机号"),
    ("移动电话", "手机"),
    ("智能手机", "手机"),
    ("电脑", "计算机"),
    ("笔记本电脑", "笔记本"),
    ("应用程序", "应用"),
    ("软件", "应用"),
    ("程序", "应用"),
    ("APP", "应用"),
    ("app", "应用"),
    ("夜间模式", "深色模式"),
    ("暗黑模式", "深色模式"),
    ("暗色模式", "深色模式"),
    ("黑暗模式", "深色模式"),
    ("网络", "wifi"),
    ("无线网", "wifi"),
    ("WiFi", "wifi"),
    ("Wi-Fi", "wifi"),
    ("上网", "wifi"),
    ("费用", "价格"),
    ("价钱", "价格"),
    ("多少钱", "价格"),
    ("收费", "价格"),
    ("花费", "价格"),
    ("预定", "预约"),
    ("预订", "预约"),
    ("挂号", "预约"),
    ("订", "预约"),
    ("约", "预约"),
    ("发票", "发票"),
    ("退款", "退款"),
    ("退钱", "退款"),
    ("快递", "配送"),
    ("物流", "配送"),
    ("送货", "配送"),
    ("发货", "配送"),
    ("寄送", "配送"),
    ("包裹", "配送"),
    ("意思", "含义"),
    ("含义", "含义"),
    ("解释", "含义"),
    ("定义", "含义"),
    ("是指", "含义"),
    ("指的是", "含义"),
    ("首都", "首都"),
    ("首府", "首都"),
    ("国家", "国"),
    ("城市", ""),
    ("发明者", "发明"),
    ("发明家", "发明"),
    ("作者", "写"),
    ("写的", "写"),
    ("编写", "写"),
    ("撰写", "写"),
    ("出生", "生"),
    ("诞生", "生"),
    ("天气预报", "天气"),
    ("气温", "天气"),
    ("温度", "天气"),
    ("联系", "联络"),
    ("联络", "联络"),
    ("客服", "客服"),
    ("人工客服", "客服"),
    ("连接", "连"),
    ("连上", "连"),
    ("连到", "连"),
    ("连不上", "不连"),
    ("医生", "医"),
    ("大夫", "医"),
    ("药物", "药"),
    ("药品", "药"),
    ("孩子", "儿童"),
    ("小孩", "儿童"),
    ("儿童", "儿童"),
    ("学习", "学"),
    ("学会", "学"),
    ("翻译", "译"),
    ("译成", "译"),
    ("中文", "汉语"),
    ("普通话", "汉语"),
    ("英文", "英语"),
    ("登陆", "登录"),
    ("账户", "账号"),
    ("帐号", "账号"),
    ("帐户", "账号"),
    ("用户名", "账号"),
    ("邮箱", "邮件"),
    ("电子邮件", "邮件"),
    ("电邮", "邮件"),
    ("照片", "图片"),
    ("相片", "图片"),
    ("图像", "图片"),
    ("最大的", "最大"),
    ("最高的", "最高"),
    ("最长的", "最长"),
    ("计算", "算"),
    ("等于", "="),
    ("加上", "+"),
    ("减去", "-"),
    ("乘以", "*"),
    ("除以", "/"),
    ("加", "+"),
    ("减", "-"),
    ("乘", "*"),
    ("除", "/"),
    ("解决", "解"),
    ("处理", "解"),
    ("修复", "解"),
    ("问题", "问题"),
    ("故障", "问题"),
    ("错误", "问题"),
    ("报错", "问题"),
];

/// Chinese function characters and words dropped before splitting into key characters.
const ZH_STOP: &[&str] = &[
    "我们", "你们", "他们", "这个", "那个", "这些", "那些", "还是", "或者", "以及", "然后", "因为",
    "所以", "但是", "如果", "的话", "时候", "谢谢", "你好", "您好", "一个", "怎", "么", "我", "你",
    "您", "他", "她", "它", "的", "地", "得", "了", "着", "过", "吗", "呢", "吧", "啊", "呀", "哦",
    "嘛", "是", "在", "把", "被", "给", "让", "对", "和", "与", "及", "或", "也", "都", "就", "还",
    "又", "再", "才", "很", "太", "更", "最", "能", "会", "要", "想", "该", "可", "以", "请", "个",
    "这", "那", "些", "哪", "里", "有", "吗", "呢", "嗯", "之", "其", "所", "为", "于", "从_",
    "向", "将", "用", "做", "弄", "搞", "下", "上", "中", "度",
];

// ---------------------------------------------------------------------------------------------
// Extraction

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
