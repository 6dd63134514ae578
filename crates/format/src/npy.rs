//! A minimal NumPy `.npy` reader/writer (format described in docs/FORMAT.md).
//!
//! Writes float32, C order, format version 1.0 — what `numpy.load` reads
//! everywhere. Reads versions 1.0–3.0, little-endian float32/float64
//! (float64 narrowed to f32: reference logits saved from Python lists are
//! float64) and, for token ids, int64/int32. Used for `strata logits --out`
//! and for tests comparing with reference logits.

use std::path::Path;

use crate::error::{Error, Result};

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy pads the header so the data starts on a 64-byte boundary.
const HEADER_ALIGN: usize = 64;

/// Element data of a decoded array.
#[derive(Debug, Clone, PartialEq)]
pub enum NpyData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

/// A decoded array: C-order data and its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: NpyData,
}

/// Serializes a float32 C-order array to .npy bytes.
pub fn encode_f32(shape: &[usize], data: &[f32]) -> Result<Vec<u8>> {
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if numel != Some(data.len()) {
        return Err(Error::Npy {
            path: "<memory>".into(),
            reason: format!("shape {shape:?} does not hold {} values", data.len()),
        });
    }
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // magic(6) + version(2) + length(2) + header + '\n' is a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(HEADER_ALIGN) - unpadded));
    header.push('\n');
    let header_len = u16::try_from(header.len())
        .map_err(|_| Error::Npy { path: "<memory>".into(), reason: "header too long for format 1.0".into() })?;
    let mut out = Vec::with_capacity(10 + header.len() + 4 * data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&header_len.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for x in data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    Ok(out)
}

/// Writes a float32 C-order array to `path`.
pub fn write_f32(path: impl AsRef<Path>, shape: &[usize], data: &[f32]) -> Result<()> {
    let path = path.as_ref();
    let bytes = encode_f32(shape, data).map_err(|e| relabel(e, path))?;
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// Reads an array from `path`.
pub fn read(path: impl AsRef<Path>) -> Result<NpyArray> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    decode(&bytes).map_err(|e| relabel(e, path))
}

/// Reads a float (f4 or f8) array from `path` as f32, with its shape.
pub fn read_f32(path: impl AsRef<Path>) -> Result<(Vec<usize>, Vec<f32>)> {
    let path = path.as_ref();
    let array = read(path)?;
    let data = match array.data {
        NpyData::F32(v) => v,
        NpyData::F64(v) => v.into_iter().map(|x| x as f32).collect(),
        NpyData::I32(_) | NpyData::I64(_) => {
            return Err(Error::Npy {
                path: path.into(),
                reason: "expected a float32/float64 array, found integers".into(),
            });
        }
    };
    Ok((array.shape, data))
}

/// Reads a 1-D int64 or int32 array (token ids) from `path`.
pub fn read_token_ids(path: impl AsRef<Path>) -> Result<Vec<i64>> {
    let path = path.as_ref();
    let array = read(path)?;
    let bad = |reason: String| Error::Npy { path: path.into(), reason };
    if array.shape.len() != 1 {
        return Err(bad(format!("expected a 1-D array of token ids, shape is {:?}", array.shape)));
    }
    match array.data {
        NpyData::I64(v) => Ok(v),
        NpyData::I32(v) => Ok(v.into_iter().map(i64::from).collect()),
        NpyData::F32(_) | NpyData::F64(_) => Err(bad("expected int64/int32 token ids, found floats".into())),
    }
}

/// Parses .npy bytes.
pub fn decode(bytes: &[u8]) -> Result<NpyArray> {
    let bad = |reason: String| Error::Npy { path: "<memory>".into(), reason };
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("not a .npy file (bad magic)".into()));
    }
    let (header_len, header_start): (usize, usize) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 => {
            let Some(len) = bytes.get(8..12) else {
                return Err(bad("truncated header".into()));
            };
            (u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize, 12)
        }
        v => return Err(bad(format!("unsupported format version {v}.{}", bytes[7]))),
    };
    let header_end = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| bad("truncated header".into()))?;
    let header = std::str::from_utf8(&bytes[header_start..header_end]).map_err(|_| bad("header is not text".into()))?;
    let dict = parse_header(header).map_err(|reason| bad(format!("header {header:?}: {reason}")))?;
    if dict.fortran_order {
        return Err(bad("Fortran-order arrays are not supported".into()));
    }
    let numel =
        dict.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| bad("shape overflows".into()))?;
    let body = &bytes[header_end..];
    let width = match dict.descr.as_str() {
        "<f4" | "<i4" => 4,
        "<f8" | "<i8" => 8,
        other => {
            return Err(bad(format!("unsupported dtype {other:?} (supported: <f4, <f8, <i4, <i8)")));
        }
    };
    if numel.checked_mul(width) != Some(body.len()) {
        return Err(bad(format!(
            "shape {:?} needs {} data bytes, file has {}",
            dict.shape,
            numel.saturating_mul(width),
            body.len()
        )));
    }
    let data = match dict.descr.as_str() {
        "<f4" => {
            NpyData::F32(body.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4]))).collect())
        }
        "<i4" => {
            NpyData::I32(body.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))).collect())
        }
        "<f8" => {
            NpyData::F64(body.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect())
        }
        _ => NpyData::I64(body.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect()),
    };
    Ok(NpyArray { shape: dict.shape, data })
}

/// Replaces the placeholder path of a decode error with the real file.
fn relabel(err: Error, path: &Path) -> Error {
    match err {
        Error::Npy { reason, .. } => Error::Npy { path: path.into(), reason },
        other => other,
    }
}

struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Parses the Python dict literal of a .npy header:
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`.
fn parse_header(text: &str) -> std::result::Result<Header, String> {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    p.expect(b'{')?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        match key.as_str() {
            "descr" => descr = Some(p.string()?),
            "fortran_order" => fortran = Some(p.boolean()?),
            "shape" => shape = Some(p.tuple()?),
            other => return Err(format!("unexpected key {other:?}")),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.skip_ws();
            p.expect(b'}')?;
            break;
        }
    }
    Ok(Header {
        descr: descr.ok_or("missing 'descr'")?,
        fortran_order: fortran.ok_or("missing 'fortran_order'")?,
        shape: shape.ok_or("missing 'shape'")?,
    })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.s.get(self.i) == Some(&c);
        if hit {
            self.i += 1;
        }
        hit
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) { Ok(()) } else { Err(format!("expected {:?} at byte {}", c as char, self.i)) }
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let quote = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a string at byte {}", self.i)),
        };
        self.i += 1;
        let start = self.i;
        while self.s.get(self.i).is_some_and(|&c| c != quote) {
            self.i += 1;
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.expect(quote)?;
        Ok(text)
    }

    fn boolean(&mut self) -> std::result::Result<bool, String> {
        for (word, value) in [(&b"True"[..], true), (&b"False"[..], false)] {
            if self.s[self.i..].starts_with(word) {
                self.i += word.len();
                return Ok(value);
            }
        }
        Err(format!("expected True or False at byte {}", self.i))
    }

    fn tuple(&mut self) -> std::result::Result<Vec<usize>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(dims);
            }
            let start = self.i;
            while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
            // Python 2 era files may write `3L`.
            let digits = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
            let dim = digits.parse::<usize>().map_err(|_| format!("expected a dimension at byte {start}"))?;
            self.eat(b'L');
            dims.push(dim);
            self.skip_ws();
            if !self.eat(b',') {
                self.skip_ws();
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_f32_shapes() {
        for shape in [vec![], vec![3], vec![2, 3], vec![1, 2, 2]] {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
            let bytes = encode_f32(&shape, &data).unwrap();
            assert_eq!((bytes.len() - 4 * n) % HEADER_ALIGN, 0, "data must start 64-aligned");
            let back = decode(&bytes).unwrap();
            assert_eq!(back.shape, shape);
            assert_eq!(back.data, NpyData::F32(data));
        }
    }

    #[test]
    fn header_matches_numpy_spelling() {
        let bytes = encode_f32(&[2], &[1.0, 2.0]).unwrap();
        let header = std::str::from_utf8(&bytes[10..bytes.len() - 8]).unwrap();
        assert!(header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"));
        assert!(header.ends_with('\n'));
        assert_eq!(&bytes[6..8], &[1, 0]);
    }

    fn with_header(header: &str, body: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn reads_int_token_ids() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<i64> = vec![1, 50279, 7];
        let body: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
        let path = dir.path().join("ids.npy");
        std::fs::write(&path, with_header("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }\n", &body))
            .unwrap();
        assert_eq!(read_token_ids(&path).unwrap(), ids);

        let body32: Vec<u8> = [5i32, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(&path, with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n", &body32))
            .unwrap();
        assert_eq!(read_token_ids(&path).unwrap(), vec![5, 6]);
    }

    #[test]
    fn reads_f64_as_f32_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        let body: Vec<u8> = [0.25f64, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(&path, with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }\n", &body))
            .unwrap();
        assert_eq!(read_f32(&path).unwrap(), (vec![1, 2], vec![0.25, -2.0]));

        write_f32(&path, &[2, 1], &[3.0, 4.0]).unwrap();
        assert_eq!(read_f32(&path).unwrap(), (vec![2, 1], vec![3.0, 4.0]));
    }

    #[test]
    fn rejects_bad_input_with_errors() {
        let good = encode_f32(&[2], &[1.0, 2.0]).unwrap();
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            b"NOTNPY\x01\x00\x00\x00".to_vec(),
            good[..good.len() - 1].to_vec(),
            good[..20].to_vec(),
            with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", &[0; 4]),
            with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", &[0; 4]),
            with_header("{'descr': '<f4', 'shape': (1,), }", &[0; 4]),
            with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,", &[0; 4]),
            with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", &[]),
        ];
        for (i, bytes) in cases.iter().enumerate() {
            assert!(decode(bytes).is_err(), "case {i} should fail");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.npy");
        std::fs::write(&path, &cases[2]).unwrap();
        let msg = read_f32(&path).unwrap_err().to_string();
        assert!(msg.contains("bad.npy"), "{msg}");
        // A float file is not token ids, and 2-D ids are rejected.
        std::fs::write(&path, &good).unwrap();
        assert!(read_token_ids(&path).is_err());
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_mutated_header_never_panics(pos in 0usize..128, byte in proptest::prelude::any::<u8>()) {
            let mut bytes = encode_f32(&[2, 3], &[0.0; 6]).unwrap();
            if pos < bytes.len() {
                bytes[pos] = byte;
            }
            let _ = decode(&bytes);
        }
    }
}
