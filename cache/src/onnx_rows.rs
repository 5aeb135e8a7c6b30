//! Keeps an int8 embedding table int8 in memory: rewrites `Gather(Cast(Q) * S, ids)` into
//! `Cast(Gather(Q, ids)) * Gather(S, ids)` in the ONNX model bytes before ONNX Runtime loads them.
//!
//! The default model stores every weight as int8 with a per-row (tables) or per-column (matrices)
//! fp32 scale, dequantised by `Cast` + `Mul` in the graph. ONNX Runtime's constant folding turns
//! all of them into fp32 initialisers at load time; for the word-embedding table (30,522 × 384)
//! that is 47 MB of fp32 where 11.7 MB of int8 would do, since a lookup reads 16 rows of it.
//! Gathering first and dequantising the gathered rows computes each value with the same single
//! `f32` multiply, so the embeddings are bit-identical (tested in `tests/real_model.rs`).
//!
//! Only that exact pattern is rewritten (the `Mul` and `Cast` results used by nothing else, the
//! scale an initialiser of shape `[rows, 1]` or a single value, `Gather` on axis 0); any other
//! model is returned unchanged. A hand-written protobuf walk: the few fields needed are read and
//! everything else is copied byte for byte.

use std::collections::{HashMap, HashSet};

/// One protobuf field: number, wire type, payload (the value bytes for length-delimited and
/// fixed fields; the varint's value for varints) and the whole encoded field.
struct Field<'a> {
    num: u64,
    wire: u8,
    payload: &'a [u8],
    varint: u64,
    raw: &'a [u8],
}

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The fields of one message, or `None` if the bytes are not a well-formed message.
fn fields(b: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let key = varint(b, &mut i)?;
        let wire = (key & 7) as u8;
        let (payload, value) = match wire {
            0 => {
                let v = varint(b, &mut i)?;
                (&b[i..i], v)
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                let p = b.get(i..i + n)?;
                i += n;
                (p, 0)
            }
            2 => {
                let n = usize::try_from(varint(b, &mut i)?).ok()?;
                let p = b.get(i..i.checked_add(n)?)?;
                i += n;
                (p, 0)
            }
            _ => return None,
        };
        out.push(Field {
            num: key >> 3,
            wire,
            payload,
            varint: value,
            raw: &b[start..i],
        });
    }
    Some(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, num: u64, bytes: &[u8]) {
    put_varint(out, (num << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn text(b: &[u8]) -> Option<String> {
    std::str::from_utf8(b).ok().map(str::to_owned)
}

/// The parts of a `NodeProto` the rewrite reads (field numbers from onnx.proto).
struct Node<'a> {
    inputs: Vec<String>,
    outputs: Vec<String>,
    name: String,
    op: String,
    domain: String,
    /// Encoded `attribute` fields, copied as they are.
    attributes: Vec<&'a [u8]>,
}

impl<'a> Node<'a> {
    fn parse(b: &'a [u8]) -> Option<Self> {
        let mut n = Node {
            inputs: Vec::new(),
            outputs: Vec::new(),
            name: String::new(),
            op: String::new(),
            domain: String::new(),
            attributes: Vec::new(),
        };
        for f in fields(b)? {
            match f.num {
                1 => n.inputs.push(text(f.payload)?),
                2 => n.outputs.push(text(f.payload)?),
                3 => n.name = text(f.payload)?,
                4 => n.op = text(f.payload)?,
                5 => n.attributes.push(f.raw),
                7 => n.domain = text(f.payload)?,
                _ => {}
            }
        }
        Some(n)
    }

    /// `Gather` on axis 0 (the default): its `axis` attribute absent or 0.
    fn gathers_rows(&self) -> bool {
        self.attributes.iter().all(|raw| {
            let Some(attr) = fields(raw).and_then(|f| f.into_iter().next()) else {
                return false;
            };
            let Some(inner) = fields(attr.payload) else {
                return false;
            };
            let is_axis = inner.iter().any(|f| f.num == 1 && f.payload == b"axis");
            let value = inner.iter().find(|f| f.num == 3).map_or(0, |f| f.varint);
            !is_axis || value == 0
        })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let mut n = Vec::new();
        for i in &self.inputs {
            put_bytes(&mut n, 1, i.as_bytes());
        }
        for o in &self.outputs {
            put_bytes(&mut n, 2, o.as_bytes());
        }
        put_bytes(&mut n, 3, self.name.as_bytes());
        put_bytes(&mut n, 4, self.op.as_bytes());
        for a in &self.attributes {
            n.extend_from_slice(a);
        }
        if !self.domain.is_empty() {
            put_bytes(&mut n, 7, self.domain.as_bytes());
        }
        put_bytes(out, 1, &n);
    }
}

/// Name and dims of a `TensorProto` initialiser.
fn initializer(b: &[u8]) -> Option<(String, Vec<u64>)> {
    let mut name = None;
    let mut dims = Vec::new();
    for f in fields(b)? {
        match (f.num, f.wire) {
            (1, 0) => dims.push(f.varint),
            (1, 2) => {
                let mut i = 0;
                while i < f.payload.len() {
                    dims.push(varint(f.payload, &mut i)?);
                }
            }
            (8, 2) => name = text(f.payload),
            _ => {}
        }
    }
    Some((name?, dims))
}

/// One table to rewrite: node indices and names.
struct Table {
    gather: usize,
    mul: usize,
    cast: usize,
    quantised: String,
    scale: String,
    /// The scale has one value per row (else it is a single value).
    per_row: bool,
}

/// The model with every int8 embedding table gathered before it is dequantised, or `None` when
/// the model has no such table (or is not a model this code can read).
pub fn gather_rows_first(model: &[u8]) -> Option<Vec<u8>> {
    let top = fields(model)?;
    let graph = top.iter().find(|f| f.num == 7 && f.wire == 2)?;
    let gfields = fields(graph.payload)?;
    let mut nodes = Vec::new();
    let mut inits: HashMap<String, Vec<u64>> = HashMap::new();
    let mut graph_outputs = HashSet::new();
    for f in &gfields {
        match f.num {
            1 => nodes.push(Node::parse(f.payload)?),
            5 => {
                let (name, dims) = initializer(f.payload)?;
                inits.insert(name, dims);
            }
            12 => {
                let name = fields(f.payload)?.into_iter().find(|x| x.num == 1)?;
                graph_outputs.insert(text(name.payload)?);
            }
            _ => {}
        }
    }
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in &n.outputs {
            producer.insert(o, i);
        }
        for x in &n.inputs {
            *uses.entry(x).or_default() += 1;
        }
    }
    let single_use = |t: &str| uses.get(t) == Some(&1) && !graph_outputs.contains(t);
    let mut tables = Vec::new();
    for (gi, g) in nodes.iter().enumerate() {
        if g.op != "Gather" || !g.domain.is_empty() || g.inputs.len() != 2 || !g.gathers_rows() {
            continue;
        }
        let Some(&mi) = producer.get(g.inputs[0].as_str()) else {
            continue;
        };
        let m = &nodes[mi];
        if m.op != "Mul" || !m.domain.is_empty() || m.inputs.len() != 2 || m.outputs.len() != 1 {
            continue;
        }
        let Some(&ci) = producer.get(m.inputs[0].as_str()) else {
            continue;
        };
        let c = &nodes[ci];
        if c.op != "Cast" || !c.domain.is_empty() || c.inputs.len() != 1 || c.outputs.len() != 1 {
            continue;
        }
        let (Some(qdims), Some(sdims)) = (inits.get(&c.inputs[0]), inits.get(&m.inputs[1])) else {
            continue;
        };
        let scalar = sdims.iter().all(|&d| d == 1);
        let per_row = qdims.len() == 2 && sdims.len() == 2 && sdims[0] == qdims[0] && sdims[1] == 1;
        if !(scalar || per_row) || !single_use(&m.outputs[0]) || !single_use(&c.outputs[0]) {
            continue;
        }
        tables.push(Table {
            gather: gi,
            mul: mi,
            cast: ci,
            quantised: c.inputs[0].clone(),
            scale: m.inputs[1].clone(),
            per_row,
        });
    }
    if tables.is_empty() {
        return None;
    }
    let removed: HashSet<usize> = tables.iter().flat_map(|t| [t.mul, t.cast]).collect();
    let dropped_values: HashSet<&str> = tables
        .iter()
        .flat_map(|t| {
            [
                nodes[t.mul].outputs[0].as_str(),
                nodes[t.cast].outputs[0].as_str(),
            ]
        })
        .collect();
    let by_gather: HashMap<usize, &Table> = tables.iter().map(|t| (t.gather, t)).collect();

    let mut new_graph = Vec::with_capacity(graph.payload.len());
    let mut index = 0;
    for f in &gfields {
        match f.num {
            1 => {
                let i = index;
                index += 1;
                if removed.contains(&i) {
                    continue;
                }
                let Some(t) = by_gather.get(&i) else {
                    new_graph.extend_from_slice(f.raw);
                    continue;
                };
                let g = &nodes[i];
                let ids = g.inputs[1].clone();
                let base = format!("{}__sy_rows", g.outputs[0]);
                let rows_q = Node {
                    inputs: vec![t.quantised.clone(), ids.clone()],
                    outputs: vec![format!("{base}_q")],
                    name: format!("{base}_gather_q"),
                    op: "Gather".into(),
                    domain: String::new(),
                    attributes: g.attributes.clone(),
                };
                let rows_f = Node {
                    inputs: rows_q.outputs.clone(),
                    outputs: vec![format!("{base}_f")],
                    name: format!("{base}_cast"),
                    op: "Cast".into(),
                    domain: String::new(),
                    attributes: nodes[t.cast].attributes.clone(),
                };
                let scale = if t.per_row {
                    let rows_s = Node {
                        inputs: vec![t.scale.clone(), ids],
                        outputs: vec![format!("{base}_scale")],
                        name: format!("{base}_gather_scale"),
                        op: "Gather".into(),
                        domain: String::new(),
                        attributes: g.attributes.clone(),
                    };
                    rows_s.encode(&mut new_graph);
                    rows_s.outputs[0].clone()
                } else {
                    t.scale.clone()
                };
                let mul = Node {
                    inputs: vec![rows_f.outputs[0].clone(), scale],
                    outputs: g.outputs.clone(),
                    name: format!("{base}_mul"),
                    op: "Mul".into(),
                    domain: String::new(),
                    attributes: nodes[t.mul].attributes.clone(),
                };
                rows_q.encode(&mut new_graph);
                rows_f.encode(&mut new_graph);
                mul.encode(&mut new_graph);
            }
            // value_info of the tensors no longer computed.
            13 => {
                let name = fields(f.payload)?
                    .into_iter()
                    .find(|x| x.num == 1)
                    .and_then(|x| text(x.payload));
                if !name.is_some_and(|n| dropped_values.contains(n.as_str())) {
                    new_graph.extend_from_slice(f.raw);
                }
            }
            _ => new_graph.extend_from_slice(f.raw),
        }
    }
    let mut out = Vec::with_capacity(model.len() + 1024);
    for f in &top {
        if f.num == 7 && f.wire == 2 {
            put_bytes(&mut out, 7, &new_graph);
        } else {
            out.extend_from_slice(f.raw);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(out: &mut Vec<u8>, op: &str, inputs: &[&str], outputs: &[&str]) {
        Node {
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            name: op.to_lowercase(),
            op: op.into(),
            domain: String::new(),
            attributes: Vec::new(),
        }
        .encode(out);
    }

    fn init(out: &mut Vec<u8>, name: &str, dims: &[u64]) {
        let mut t = Vec::new();
        for &d in dims {
            put_varint(&mut t, 1 << 3);
            put_varint(&mut t, d);
        }
        put_bytes(&mut t, 8, name.as_bytes());
        put_bytes(out, 5, &t);
    }

    fn model(scale_dims: &[u64], extra_use: bool) -> Vec<u8> {
        let mut g = Vec::new();
        node(&mut g, "Cast", &["q"], &["f"]);
        node(&mut g, "Mul", &["f", "s"], &["w"]);
        node(&mut g, "Gather", &["w", "ids"], &["e"]);
        if extra_use {
            node(&mut g, "Identity", &["w"], &["w2"]);
        }
        init(&mut g, "q", &[10, 4]);
        init(&mut g, "s", scale_dims);
        let mut m = Vec::new();
        put_varint(&mut m, 1 << 3);
        put_varint(&mut m, 8);
        put_bytes(&mut m, 7, &g);
        m
    }

    fn ops(model: &[u8]) -> Vec<(String, Vec<String>, Vec<String>)> {
        let top = fields(model).unwrap_or_default();
        let g = top
            .iter()
            .find(|f| f.num == 7)
            .map(|f| f.payload)
            .unwrap_or_default();
        fields(g)
            .unwrap_or_default()
            .iter()
            .filter(|f| f.num == 1)
            .filter_map(|f| Node::parse(f.payload))
            .map(|n| (n.op, n.inputs, n.outputs))
            .collect()
    }

    #[test]
    fn per_row_tables_are_gathered_before_dequantising() {
        let out = gather_rows_first(&model(&[10, 1], false));
        let got = ops(out.as_deref().unwrap_or_default());
        let names: Vec<&str> = got.iter().map(|(op, _, _)| op.as_str()).collect();
        assert_eq!(names, ["Gather", "Gather", "Cast", "Mul"]);
        assert_eq!(got[0].1, ["s", "ids"]);
        assert_eq!(got[1].1, ["q", "ids"]);
        assert_eq!(got[3].2, ["e"]);
        // The model's other fields survive.
        assert!(out.unwrap_or_default().starts_with(&[0x08, 8]));
    }

    #[test]
    fn a_single_scale_is_not_gathered() {
        let out = gather_rows_first(&model(&[1], false));
        let got = ops(out.as_deref().unwrap_or_default());
        let names: Vec<&str> = got.iter().map(|(op, _, _)| op.as_str()).collect();
        assert_eq!(names, ["Gather", "Cast", "Mul"]);
        assert_eq!(got[2].1[1], "s");
    }

    #[test]
    fn other_shapes_and_shared_tables_stay_as_they_are() {
        assert!(gather_rows_first(&model(&[1, 4], false)).is_none());
        assert!(gather_rows_first(&model(&[10, 1], true)).is_none());
        assert!(gather_rows_first(b"not a model").is_none());
    }
}
