//! The bytes of a layer's share of a union, out to a worker and back: the
//! payload of one Zenoh query and its reply (Zenoh frames, routes and
//! times them out). Little-endian; every length read from a peer is checked
//! against the bytes that carry it before anything is allocated.
//!
//! Request: `SXQ1`, layer, hidden, call count (u32 each), then per call its
//! expert and row count (u32) and `rows × hidden` f32.
//! Reply: `SXR1`, call count, then per call its row count and
//! `rows × hidden` f32, in the request's order.

use strata_sched::ExpertCall;

use crate::{Error, Result};

const REQUEST_MAGIC: &[u8; 4] = b"SXQ1";
const REPLY_MAGIC: &[u8; 4] = b"SXR1";

/// A decoded request: which layer, how wide, and the calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub layer: usize,
    pub hidden: usize,
    pub calls: Vec<ExpertCall>,
}

fn push_u32(bytes: &mut Vec<u8>, value: usize) {
    let value = u32::try_from(value).expect("a union's counts and widths fit in u32");
    bytes.extend_from_slice(&value.to_le_bytes());
}

fn push_floats(bytes: &mut Vec<u8>, floats: &[f32]) {
    bytes.reserve(floats.len() * 4);
    for float in floats {
        bytes.extend_from_slice(&float.to_le_bytes());
    }
}

pub fn encode_request(layer: usize, hidden: usize, calls: &[ExpertCall]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16 + calls.iter().map(|call| 8 + call.xs.len() * 4).sum::<usize>());
    bytes.extend_from_slice(REQUEST_MAGIC);
    push_u32(&mut bytes, layer);
    push_u32(&mut bytes, hidden);
    push_u32(&mut bytes, calls.len());
    for call in calls {
        assert!(hidden > 0 && call.xs.len().is_multiple_of(hidden), "a call's states are whole rows");
        push_u32(&mut bytes, call.expert);
        push_u32(&mut bytes, call.xs.len() / hidden);
        push_floats(&mut bytes, &call.xs);
    }
    bytes
}

pub fn encode_reply(outputs: &[Vec<f32>], hidden: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + outputs.iter().map(|ys| 4 + ys.len() * 4).sum::<usize>());
    bytes.extend_from_slice(REPLY_MAGIC);
    push_u32(&mut bytes, outputs.len());
    for ys in outputs {
        assert!(hidden > 0 && ys.len().is_multiple_of(hidden), "an output is whole rows");
        push_u32(&mut bytes, ys.len() / hidden);
        push_floats(&mut bytes, ys);
    }
    bytes
}

/// A cursor over a peer's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8]> {
        if self.bytes.len() < len {
            return Err(Error::Wire(format!("{what}: {len} bytes wanted, {} left", self.bytes.len())));
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    fn magic(&mut self, magic: &[u8; 4]) -> Result<()> {
        match self.take(4, "magic")? == magic {
            true => Ok(()),
            false => Err(Error::Wire(format!("not a {} message", String::from_utf8_lossy(magic)))),
        }
    }

    fn u32(&mut self, what: &str) -> Result<usize> {
        let bytes: [u8; 4] = self.take(4, what)?.try_into().expect("took 4 bytes");
        Ok(u32::from_le_bytes(bytes) as usize)
    }

    /// `rows × hidden` floats, the product checked against what is left.
    fn rows(&mut self, rows: usize, hidden: usize, what: &str) -> Result<Vec<f32>> {
        let len = rows
            .checked_mul(hidden)
            .and_then(|floats| floats.checked_mul(4))
            .ok_or_else(|| Error::Wire(format!("{what}: {rows} rows of {hidden} overflow")))?;
        let bytes = self.take(len, what)?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("chunks of 4"))).collect())
    }

    fn end(&self) -> Result<()> {
        match self.bytes.is_empty() {
            true => Ok(()),
            false => Err(Error::Wire(format!("{} bytes past the end", self.bytes.len()))),
        }
    }
}

pub fn decode_request(bytes: &[u8]) -> Result<Request> {
    let mut reader = Reader { bytes };
    reader.magic(REQUEST_MAGIC)?;
    let layer = reader.u32("layer")?;
    let hidden = reader.u32("hidden")?;
    if hidden == 0 {
        return Err(Error::Wire("a hidden width of 0".into()));
    }
    let count = reader.u32("call count")?;
    // Each call takes at least its 8-byte head: a count past that is a lie,
    // refused before it sizes anything.
    if count > bytes.len() / 8 {
        return Err(Error::Wire(format!("{count} calls in {} bytes", bytes.len())));
    }
    let mut calls = Vec::with_capacity(count);
    for _ in 0..count {
        let expert = reader.u32("expert")?;
        let rows = reader.u32("rows")?;
        calls.push(ExpertCall { expert, xs: reader.rows(rows, hidden, "hidden states")? });
    }
    reader.end()?;
    Ok(Request { layer, hidden, calls })
}

/// The outputs of a reply to `calls` calls of `rows[i]` rows each: anything
/// else is the worker's error.
pub fn decode_reply(bytes: &[u8], hidden: usize, rows: &[usize]) -> Result<Vec<Vec<f32>>> {
    let mut reader = Reader { bytes };
    reader.magic(REPLY_MAGIC)?;
    let count = reader.u32("output count")?;
    if count != rows.len() {
        return Err(Error::Wire(format!("{count} outputs for {} calls", rows.len())));
    }
    let mut outputs = Vec::with_capacity(count);
    for &wanted in rows {
        let got = reader.u32("rows")?;
        if got != wanted {
            return Err(Error::Wire(format!("{got} output rows for {wanted} input rows")));
        }
        outputs.push(reader.rows(got, hidden, "outputs")?);
    }
    reader.end()?;
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls() -> Vec<ExpertCall> {
        vec![
            ExpertCall { expert: 3, xs: vec![1.0, -2.5, f32::MIN_POSITIVE, 4.0] },
            ExpertCall { expert: 17, xs: vec![0.5, 0.25] },
        ]
    }

    #[test]
    fn a_request_and_its_reply_round_trip_bit_for_bit() {
        let request = encode_request(5, 2, &calls());
        assert_eq!(decode_request(&request).unwrap(), Request { layer: 5, hidden: 2, calls: calls() });
        let outputs = vec![vec![-0.0, 1e-30, 3.0, 7.5], vec![f32::MAX, -1.0]];
        assert_eq!(decode_reply(&encode_reply(&outputs, 2), 2, &[2, 1]).unwrap(), outputs);
    }

    #[test]
    fn a_request_whose_counts_outrun_its_bytes_is_refused() {
        let mut request = encode_request(5, 2, &calls());
        // The first call claims 2^31 rows.
        request[20..24].copy_from_slice(&(1u32 << 31).to_le_bytes());
        assert!(matches!(decode_request(&request), Err(Error::Wire(_))));
        let mut request = encode_request(5, 2, &calls());
        request[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_request(&request), Err(Error::Wire(_))));
        assert!(matches!(decode_request(&request[..request.len() - 1]), Err(Error::Wire(_))));
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_refused() {
        let outputs = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
        let reply = encode_reply(&outputs, 2);
        assert!(decode_reply(&reply, 2, &[1]).is_err(), "fewer calls than outputs");
        assert!(decode_reply(&reply, 2, &[1, 2]).is_err(), "a call of other rows");
        assert!(decode_reply(&encode_request(0, 2, &calls()), 2, &[2, 1]).is_err(), "not a reply");
    }
}
