//! A thread's `contextvars`, read from the target: the thread state's
//! current `Context` (`PyThreadState.context`), its variables
//! (`PyContext.ctx_vars`, a HAMT: `Python/hamt.c`), and the value one
//! `ContextVar` has there, looked up by the variable's hash as CPython does.
//!
//! HAMT nodes are not in the headers; hamt.c lays them out, from 3.8 to
//! 3.15, right after the object header: a bitmap node {`ob_size`, `uint32_t
//! b_bitmap`, `b_array[]` of key/value pairs (a NULL key: the value is a
//! sub-node)}, an array node {`a_array[32]` of sub-nodes}, a collision node
//! {`ob_size`, `int32_t c_hash`, `c_array[]` of key/value pairs}. Node kinds
//! are told apart by their type's name, learned once per type.
//!
//! Invariants: nodes are immutable once built, but may be freed and reused
//! while read; every size and index is range-checked, a lookup visits at
//! most [`MAX_DEPTH`] nodes, and a node of an unknown type is an error, so a
//! torn read fails rather than finds a value under another key.

use std::collections::HashMap;
use std::io;

use crate::remote::process::{rd_u32, rd_u64};
use crate::target::pyobject::Reader;

/// Nodes visited per lookup, at most: 7 levels of 5 hash bits, then a
/// collision node.
pub const MAX_DEPTH: usize = 8;
/// Memory reads [`state`] does, at most.
pub const STATE_READS: u32 = 3;
/// Key/value pairs of a collision node read, at most.
const MAX_COLLISIONS: u64 = 64;

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A `ContextVar` of the target: its address (the HAMT key) and its hash as
/// the HAMT uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Var {
    pub addr: u64,
    pub hash: i32,
}

impl Var {
    /// The variable at `addr` (which the caller knows is a `ContextVar`).
    pub fn read(r: &Reader, addr: u64) -> io::Result<Var> {
        let h = r.u64(addr + r.target().layout.objects.contextvar_hash)?;
        Ok(Var { addr, hash: hamt_hash(h as i64) })
    }
}

/// hamt.c's `hamt_hash`: a 64-bit `Py_hash_t` folded to 32 bits by xor, -1
/// (the error value) made -2.
pub fn hamt_hash(h: i64) -> i32 {
    let x = (h as u64 as u32 as i32) ^ ((h >> 32) as i32);
    if x == -1 {
        -2
    } else {
        x
    }
}

/// What a HAMT node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bitmap,
    Array,
    Collision,
}

/// Node types seen so far, by type address.
#[derive(Default)]
pub struct NodeKinds(HashMap<u64, Option<Kind>>);

impl NodeKinds {
    /// The bitmap and array node types, where seen (0: not yet).
    pub fn node_types(&self) -> (u64, u64) {
        let of = |want| self.0.iter().find(|(_, k)| **k == Some(want)).map_or(0, |(t, _)| *t);
        (of(Kind::Bitmap), of(Kind::Array))
    }

    fn kind(&mut self, r: &Reader, ty: u64) -> io::Result<Kind> {
        if let Some(k) = self.0.get(&ty) {
            return k.ok_or_else(|| bad("not a HAMT node"));
        }
        let (name, _) = r.type_info(ty)?;
        let k = match name.as_str() {
            "hamt_bitmap_node" => Some(Kind::Bitmap),
            "hamt_array_node" => Some(Kind::Array),
            "hamt_collision_node" => Some(Kind::Collision),
            _ => None,
        };
        // Only node types are remembered: a torn read's garbage type is not.
        if let Some(k) = k {
            if self.0.len() < 16 {
                self.0.insert(ty, Some(k));
            }
        }
        k.ok_or_else(|| bad("not a HAMT node"))
    }
}

/// A thread's context variables at one moment: their HAMT's address and
/// size. Setting or deleting a variable replaces the HAMT: the same address
/// and size again (the old HAMT's memory reused by one of the same size)
/// means at worst another value of a variable that was set then too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    hamt: u64,
    count: u64,
}

/// The variables of the current `Context` of the thread state at `tstate`
/// now, and their HAMT's root node (None: the thread has no context yet).
pub fn state(r: &Reader, tstate: u64) -> io::Result<Option<(Mark, u64)>> {
    let t = r.target();
    let o = &t.layout.objects;
    let ctx = r.u64(tstate + o.tstate_context)?;
    if ctx == 0 {
        return Ok(None);
    }
    // Its type and variables in one read.
    let b = r.read_bytes(ctx, (o.context_vars.max(t.layout.object_type) + 8) as usize)?;
    if t.context_type.is_some_and(|want| rd_u64(&b, t.layout.object_type as usize) != want) {
        return Err(bad("not a Context"));
    }
    let hamt = rd_u64(&b, o.context_vars as usize);
    if hamt == 0 {
        return Err(bad("Context without variables"));
    }
    let b = r.read_bytes(hamt + o.hamt_root, (o.hamt_count - o.hamt_root + 8) as usize)?;
    let count = rd_u64(&b, (o.hamt_count - o.hamt_root) as usize);
    Ok(Some((Mark { hamt, count }, rd_u64(&b, 0))))
}

/// The value of `var` in the HAMT whose root node is `root` (None: not set).
pub fn lookup(r: &Reader, kinds: &mut NodeKinds, root: u64, var: Var) -> io::Result<Option<u64>> {
    let l = &r.target().layout;
    // Fields after the object header, and after the variable-size one.
    let head = l.object_type + 8;
    let var_head = head + 8;
    let hash = var.hash as u32;
    let mut node = root;
    let mut shift = 0;
    for _ in 0..MAX_DEPTH {
        if node == 0 {
            return Err(bad("NULL HAMT node"));
        }
        let hdr = r.read_bytes(node, (var_head + 8) as usize)?;
        let size = rd_u64(&hdr, (l.object_type + 8) as usize);
        let slot = (hash >> shift) & 0x1f;
        match kinds.kind(r, rd_u64(&hdr, l.object_type as usize))? {
            Kind::Bitmap => {
                let bitmap = rd_u32(&hdr, var_head as usize);
                if size != 2 * bitmap.count_ones() as u64 {
                    return Err(bad("torn bitmap node"));
                }
                let bit = 1u32 << slot;
                if bitmap & bit == 0 {
                    return Ok(None);
                }
                let idx = (bitmap & (bit - 1)).count_ones() as u64;
                let pair = r.read_bytes(node + var_head + 8 + 16 * idx, 16)?;
                let (key, value) = (rd_u64(&pair, 0), rd_u64(&pair, 8));
                if key == 0 {
                    node = value;
                } else {
                    return Ok((key == var.addr).then_some(value));
                }
            }
            Kind::Array => {
                node = r.u64(node + head + 8 * slot as u64)?;
                if node == 0 {
                    return Ok(None);
                }
            }
            Kind::Collision => {
                let n = size / 2;
                if size % 2 != 0 || n == 0 || n > MAX_COLLISIONS {
                    return Err(bad("torn collision node"));
                }
                let pairs = r.read_bytes(node + var_head + 8, (16 * n) as usize)?;
                let found = (0..n as usize).find(|&i| rd_u64(&pairs, 16 * i) == var.addr);
                return Ok(found.map(|i| rd_u64(&pairs, 16 * i + 8)));
            }
        }
        shift += 5;
        if shift > 30 {
            return Err(bad("HAMT deeper than a hash"));
        }
    }
    Err(bad("HAMT lookup too deep"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_folds_as_hamt_c() {
        assert_eq!(hamt_hash(0x1234_5678), 0x1234_5678);
        assert_eq!(hamt_hash(0x0000_0001_0000_0000), 1);
        // Halves that fold to -1 (CPython's error value) give -2.
        assert_eq!(hamt_hash(0xffff_ffff), -2);
        assert_eq!(hamt_hash(-1), 0);
    }
}
