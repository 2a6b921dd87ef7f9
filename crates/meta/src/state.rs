//! The state a store holds: named objects, the operations that change them, and the
//! checkpoint encoding of the whole.
//!
//! Every change is an [`Op`]. Applying an op returns its [`Undo`], so a transaction that turns
//! out not to fit is rolled back exactly; replaying the journal applies the same ops in the same
//! order and so rebuilds the same state. The state also keeps, exactly, the number of bytes its
//! checkpoint would take, which is what metadata space accounting is about.

use std::collections::{BTreeMap, HashMap};

use bytes::BufMut;

use crate::codec::{put_name, DecodeError, Reader};
use crate::objects::{
    Bitmap, BitmapUndo, Table, Value, BITMAP_PAGE_BITS, BITMAP_PAGE_BYTES, MAX_VALUE_SIZE,
    TABLE_PAGE_ENTRIES,
};

pub type ObjectId = u32;

/// Largest blob, so that one record never dominates a checkpoint.
pub const MAX_BLOB_SIZE: usize = 1 << 20;
/// Most bits one op may change, so that an op's undo stays small.
pub const MAX_BITS_PER_OP: u64 = 1 << 20;
/// Longest object name.
pub const MAX_NAME_LEN: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectKind {
    Table = 1,
    Bitmap = 2,
    Blob = 3,
}

impl ObjectKind {
    fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(ObjectKind::Table),
            2 => Some(ObjectKind::Bitmap),
            3 => Some(ObjectKind::Blob),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Table(Table),
    Bitmap(Bitmap),
    Blob(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub name: String,
    pub body: Body,
}

impl Object {
    pub fn kind(&self) -> ObjectKind {
        match self.body {
            Body::Table(_) => ObjectKind::Table,
            Body::Bitmap(_) => ObjectKind::Bitmap,
            Body::Blob(_) => ObjectKind::Blob,
        }
    }

    fn value_size(&self) -> u32 {
        match &self.body {
            Body::Table(table) => table.value_size() as u32,
            _ => 0,
        }
    }

    /// Checkpoint bytes of this object.
    fn encoded_bytes(&self) -> u64 {
        header_bytes(&self.name)
            + match &self.body {
                Body::Table(table) => table.encoded_bytes(),
                Body::Bitmap(bitmap) => bitmap.pages() * BITMAP_PAGE_BYTES,
                Body::Blob(data) => 4 + data.len() as u64,
            }
    }
}

/// Checkpoint bytes of an object's header: id, kind, name, value size, item count.
fn header_bytes(name: &str) -> u64 {
    4 + 1 + 1 + name.len() as u64 + 4 + 8
}

/// One change to the state. The journal is a sequence of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create {
        id: ObjectId,
        kind: ObjectKind,
        value_size: u32,
        name: String,
    },
    Delete {
        id: ObjectId,
    },
    Set {
        id: ObjectId,
        index: u64,
        value: Value,
    },
    SetBits {
        id: ObjectId,
        start: u64,
        count: u64,
        value: bool,
    },
    PutBlob {
        id: ObjectId,
        data: Vec<u8>,
    },
}

/// How to take an applied op back.
pub(crate) enum Undo {
    Create {
        id: ObjectId,
        next_id: ObjectId,
    },
    Delete {
        id: ObjectId,
        object: Object,
    },
    Set {
        id: ObjectId,
        index: u64,
        old: Value,
    },
    SetBits {
        id: ObjectId,
        pages: BitmapUndo,
    },
    PutBlob {
        id: ObjectId,
        old: Vec<u8>,
    },
}

/// Why an op cannot apply. At run time this is a layer's bug; during recovery, corruption.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("no object {0}")]
    NoObject(ObjectId),
    #[error("object {id} is a {actual:?}, not a {wanted:?}")]
    WrongKind {
        id: ObjectId,
        actual: ObjectKind,
        wanted: ObjectKind,
    },
    #[error("object {0} already exists")]
    Exists(String),
    #[error("bad op: {0}")]
    Invalid(String),
}

/// Named objects and the exact size of their checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    objects: BTreeMap<ObjectId, Object>,
    names: HashMap<String, ObjectId>,
    next_id: ObjectId,
    encoded_bytes: u64,
}

/// Checkpoint bytes before the first object: next id and object count.
const STATE_HEADER_BYTES: u64 = 8;

impl State {
    pub fn new() -> Self {
        State {
            encoded_bytes: STATE_HEADER_BYTES,
            next_id: 1,
            ..State::default()
        }
    }

    /// Bytes the checkpoint of this state takes.
    pub fn encoded_bytes(&self) -> u64 {
        self.encoded_bytes
    }

    pub fn next_id(&self) -> ObjectId {
        self.next_id
    }

    pub fn id(&self, name: &str) -> Option<ObjectId> {
        self.names.get(name).copied()
    }

    pub fn object(&self, id: ObjectId) -> Option<&Object> {
        self.objects.get(&id)
    }

    pub fn objects(&self) -> impl Iterator<Item = (ObjectId, &Object)> {
        self.objects.iter().map(|(id, object)| (*id, object))
    }

    pub fn table(&self, id: ObjectId) -> Option<&Table> {
        match &self.objects.get(&id)?.body {
            Body::Table(table) => Some(table),
            _ => None,
        }
    }

    pub fn bitmap(&self, id: ObjectId) -> Option<&Bitmap> {
        match &self.objects.get(&id)?.body {
            Body::Bitmap(bitmap) => Some(bitmap),
            _ => None,
        }
    }

    pub fn blob(&self, id: ObjectId) -> Option<&[u8]> {
        match &self.objects.get(&id)?.body {
            Body::Blob(data) => Some(data),
            _ => None,
        }
    }

    fn body_mut(&mut self, id: ObjectId, wanted: ObjectKind) -> Result<&mut Body, ApplyError> {
        let object = self.objects.get_mut(&id).ok_or(ApplyError::NoObject(id))?;
        let actual = object.kind();
        if actual != wanted {
            return Err(ApplyError::WrongKind { id, actual, wanted });
        }
        Ok(&mut object.body)
    }

    fn grow(&mut self, delta: i64) {
        self.encoded_bytes = self
            .encoded_bytes
            .checked_add_signed(delta)
            .expect("checkpoint size accounting went negative");
    }

    /// Applies one op, or changes nothing and says why.
    pub(crate) fn apply(&mut self, op: &Op) -> Result<Undo, ApplyError> {
        match op {
            Op::Create {
                id,
                kind,
                value_size,
                name,
            } => self.create(*id, *kind, *value_size, name),
            Op::Delete { id } => {
                let object = self.objects.remove(id).ok_or(ApplyError::NoObject(*id))?;
                self.names.remove(&object.name);
                self.grow(-(object.encoded_bytes() as i64));
                Ok(Undo::Delete { id: *id, object })
            }
            Op::Set { id, index, value } => {
                let Body::Table(table) = self.body_mut(*id, ObjectKind::Table)? else {
                    unreachable!()
                };
                if value.len() != table.value_size() {
                    let size = table.value_size();
                    return Err(ApplyError::Invalid(format!(
                        "value of {} bytes for a table of {size}-byte values",
                        value.len()
                    )));
                }
                let (old, delta) = table.set(*index, value);
                self.grow(delta);
                Ok(Undo::Set {
                    id: *id,
                    index: *index,
                    old,
                })
            }
            Op::SetBits {
                id,
                start,
                count,
                value,
            } => {
                if *count > MAX_BITS_PER_OP || start.checked_add(*count).is_none() {
                    return Err(ApplyError::Invalid(format!("{count} bits from {start}")));
                }
                let Body::Bitmap(bitmap) = self.body_mut(*id, ObjectKind::Bitmap)? else {
                    unreachable!()
                };
                let (pages, delta) = bitmap.set_range(*start, *count, *value);
                self.grow(delta);
                Ok(Undo::SetBits { id: *id, pages })
            }
            Op::PutBlob { id, data } => {
                if data.len() > MAX_BLOB_SIZE {
                    return Err(ApplyError::Invalid(format!("blob of {} bytes", data.len())));
                }
                let Body::Blob(blob) = self.body_mut(*id, ObjectKind::Blob)? else {
                    unreachable!()
                };
                let old = std::mem::replace(blob, data.clone());
                self.grow(data.len() as i64 - old.len() as i64);
                Ok(Undo::PutBlob { id: *id, old })
            }
        }
    }

    fn create(
        &mut self,
        id: ObjectId,
        kind: ObjectKind,
        value_size: u32,
        name: &str,
    ) -> Result<Undo, ApplyError> {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(ApplyError::Invalid(format!("object name {name:?}")));
        }
        if self.names.contains_key(name) {
            return Err(ApplyError::Exists(name.to_string()));
        }
        if id == 0 || id == ObjectId::MAX || self.objects.contains_key(&id) {
            return Err(ApplyError::Invalid(format!("object id {id} in use")));
        }
        let body = match kind {
            ObjectKind::Table if (1..=MAX_VALUE_SIZE as u32).contains(&value_size) => {
                Body::Table(Table::new(value_size as usize))
            }
            ObjectKind::Table => {
                return Err(ApplyError::Invalid(format!(
                    "table value size {value_size}"
                )))
            }
            ObjectKind::Bitmap => Body::Bitmap(Bitmap::default()),
            ObjectKind::Blob => Body::Blob(Vec::new()),
        };
        let object = Object {
            name: name.to_string(),
            body,
        };
        self.grow(object.encoded_bytes() as i64);
        self.objects.insert(id, object);
        self.names.insert(name.to_string(), id);
        let next_id = self.next_id;
        self.next_id = self.next_id.max(id + 1);
        Ok(Undo::Create { id, next_id })
    }

    /// Takes back an op applied by [`State::apply`]; undos must come in reverse order.
    pub(crate) fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Create { id, next_id } => {
                let object = self.objects.remove(&id).expect("undo of a create");
                self.names.remove(&object.name);
                self.grow(-(object.encoded_bytes() as i64));
                self.next_id = next_id;
            }
            Undo::Delete { id, object } => {
                self.grow(object.encoded_bytes() as i64);
                self.names.insert(object.name.clone(), id);
                self.objects.insert(id, object);
            }
            Undo::Set { id, index, old } => {
                let Ok(Body::Table(table)) = self.body_mut(id, ObjectKind::Table) else {
                    panic!("undo of a set on object {id}, which is not a table")
                };
                let (_, delta) = table.set(index, &old);
                self.grow(delta);
            }
            Undo::SetBits { id, pages } => {
                let Ok(Body::Bitmap(bitmap)) = self.body_mut(id, ObjectKind::Bitmap) else {
                    panic!("undo of set-bits on object {id}, which is not a bitmap")
                };
                let delta = bitmap.restore(pages);
                self.grow(delta);
            }
            Undo::PutBlob { id, old } => {
                let Ok(Body::Blob(blob)) = self.body_mut(id, ObjectKind::Blob) else {
                    panic!("undo of a blob put on object {id}, which is not a blob")
                };
                let delta = old.len() as i64 - blob.len() as i64;
                *blob = old;
                self.grow(delta);
            }
        }
    }
}

/// Appends the checkpoint encoding of `state`: next id, object count, then each object with
/// its header and its present pages (tables, bitmaps) or bytes (blobs).
pub fn encode_checkpoint(state: &State, out: &mut Vec<u8>) {
    let start = out.len();
    out.put_u32_le(state.next_id);
    out.put_u32_le(state.objects.len() as u32);
    for (id, object) in &state.objects {
        out.put_u32_le(*id);
        out.put_u8(object.kind() as u8);
        put_name(out, &object.name);
        out.put_u32_le(object.value_size());
        match &object.body {
            Body::Table(table) => {
                out.put_u64_le(table.pages());
                let size = table.value_size();
                for (page_no, mask, values) in table.pages_with_masks() {
                    out.put_u64_le(page_no);
                    out.put_u64_le(mask);
                    for (i, value) in values.chunks_exact(size).enumerate() {
                        if mask & 1 << i != 0 {
                            out.put_slice(value);
                        }
                    }
                }
            }
            Body::Bitmap(bitmap) => {
                out.put_u64_le(bitmap.pages());
                for (page_no, page) in &bitmap.pages {
                    out.put_u64_le(*page_no);
                    page.words().iter().for_each(|w| out.put_u64_le(*w));
                }
            }
            Body::Blob(data) => {
                out.put_u64_le(1);
                out.put_u32_le(data.len() as u32);
                out.put_slice(data);
            }
        }
    }
    assert_eq!((out.len() - start) as u64, state.encoded_bytes);
}

/// How a checkpoint stores a table page: the superblock's format version says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TablePages {
    /// Versions 1 and 2: the page number, then all 64 values.
    Whole,
    /// Version 3: the page number, the mask of present entries, then only their values.
    Masked,
}

impl TablePages {
    pub fn of_version(format_version: u32) -> TablePages {
        if format_version >= 3 {
            TablePages::Masked
        } else {
            TablePages::Whole
        }
    }
}

/// Rebuilds a state from its checkpoint encoding, checking every count and size. The state
/// keeps its accounting in the current encoding (`TablePages::Masked`), which is what its
/// next checkpoint will take.
pub fn decode_checkpoint(stream: &[u8], pages: TablePages) -> Result<State, DecodeError> {
    let mut reader = Reader::new(stream);
    let mut state = State::new();
    let next_id = reader.u32("next object id")?;
    let count = reader.u32("object count")?;
    for _ in 0..count {
        let at = reader.position();
        let id = reader.u32("object id")?;
        let kind = reader.u8("object kind")?;
        let kind = ObjectKind::from_u8(kind)
            .ok_or_else(|| reader.error(format!("object {id}: unknown kind {kind}")))?;
        let name = reader.name("object name")?;
        let value_size = reader.u32("value size")?;
        let items = reader.u64("item count")?;
        state
            .create(id, kind, value_size, &name)
            .map_err(|e| DecodeError {
                at,
                what: format!("object {id} ({name}): {e}"),
            })?;
        let object = state.objects.get_mut(&id).expect("just created");
        let empty_bytes = object.encoded_bytes();
        decode_body(&mut reader, object, items, pages)?;
        state.encoded_bytes += object.encoded_bytes() - empty_bytes;
    }
    if !reader.is_empty() {
        return Err(reader.error(format!(
            "{} bytes after the last object",
            reader.remaining()
        )));
    }
    if next_id < state.next_id {
        return Err(reader.error(format!("next object id {next_id} is in use")));
    }
    state.next_id = next_id;
    Ok(state)
}

fn decode_body(
    reader: &mut Reader,
    object: &mut Object,
    items: u64,
    pages: TablePages,
) -> Result<(), DecodeError> {
    let name = object.name.clone();
    let at = reader.position();
    let mut last_page = None;
    let mut ordered = |page_no: u64| {
        let ok = last_page.is_none_or(|last| page_no > last);
        last_page = Some(page_no);
        ok
    };
    match &mut object.body {
        Body::Table(table) => {
            let size = table.value_size();
            let page_len = TABLE_PAGE_ENTRIES as usize * size;
            for _ in 0..items {
                let page_no = reader.u64("table page number")?;
                let values: Box<[u8]> = match pages {
                    TablePages::Whole => reader.bytes(page_len, "table page")?.into(),
                    TablePages::Masked => {
                        let mask = reader.u64("table page mask")?;
                        let mut values = vec![0u8; page_len];
                        for i in (0..TABLE_PAGE_ENTRIES as usize).filter(|i| mask & 1 << i != 0) {
                            let value = reader.bytes(size, "table value")?;
                            if value.iter().all(|&b| b == 0) {
                                return Err(reader.error(format!(
                                    "{name}: page {page_no} stores entry {i} as present but all zeros"
                                )));
                            }
                            values[i * size..(i + 1) * size].copy_from_slice(value);
                        }
                        values.into()
                    }
                };
                if !ordered(page_no) || !table.insert_page(page_no, values) {
                    return Err(
                        reader.error(format!("{name}: page {page_no} is empty or repeated"))
                    );
                }
            }
        }
        Body::Bitmap(bitmap) => {
            for _ in 0..items {
                let page_no = reader.u64("bitmap page number")?;
                let mut words = Box::new([0u64; (BITMAP_PAGE_BITS / 64) as usize]);
                for word in words.iter_mut() {
                    *word = reader.u64("bitmap word")?;
                }
                if !ordered(page_no) || !bitmap.insert_page(page_no, words) {
                    return Err(
                        reader.error(format!("{name}: page {page_no} is empty or repeated"))
                    );
                }
            }
        }
        Body::Blob(data) => {
            if items != 1 {
                return Err(DecodeError {
                    at,
                    what: format!("{name}: blob with {items} parts"),
                });
            }
            let len = reader.u32("blob length")? as usize;
            if len > MAX_BLOB_SIZE {
                return Err(reader.error(format!("{name}: blob of {len} bytes")));
            }
            *data = reader.bytes(len, "blob")?.to_vec();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        let mut state = State::new();
        let ops = [
            Op::Create {
                id: 1,
                kind: ObjectKind::Table,
                value_size: 4,
                name: "map".into(),
            },
            Op::Create {
                id: 2,
                kind: ObjectKind::Bitmap,
                value_size: 0,
                name: "live".into(),
            },
            Op::Create {
                id: 3,
                kind: ObjectKind::Blob,
                value_size: 0,
                name: "config".into(),
            },
            Op::Set {
                id: 1,
                index: 1_000_000,
                value: Value::from_slice(&9u32.to_le_bytes()),
            },
            Op::SetBits {
                id: 2,
                start: 100,
                count: 5000,
                value: true,
            },
            Op::PutBlob {
                id: 3,
                data: b"extent=512KiB".to_vec(),
            },
        ];
        for op in &ops {
            state.apply(op).unwrap();
        }
        state
    }

    #[test]
    fn checkpoint_round_trips_and_its_size_is_exact() {
        let state = sample();
        let mut out = Vec::new();
        encode_checkpoint(&state, &mut out);
        assert_eq!(out.len() as u64, state.encoded_bytes());
        let back = decode_checkpoint(&out, TablePages::Masked).unwrap();
        assert_eq!(back, state);
        assert_eq!(back.table(1).unwrap().get_u32(1_000_000), 9);
        assert_eq!(back.bitmap(2).unwrap().count_ones(), 5000);
    }

    #[test]
    fn undo_restores_exactly() {
        let before = sample();
        let mut state = before.clone();
        let ops = [
            Op::Set {
                id: 1,
                index: 1_000_000,
                value: Value::from_elem(0, 4),
            },
            Op::SetBits {
                id: 2,
                start: 0,
                count: 9000,
                value: false,
            },
            Op::PutBlob {
                id: 3,
                data: vec![1; 100],
            },
            Op::Delete { id: 3 },
            Op::Create {
                id: 7,
                kind: ObjectKind::Table,
                value_size: 16,
                name: "other".into(),
            },
        ];
        let undos: Vec<Undo> = ops.iter().map(|op| state.apply(op).unwrap()).collect();
        assert_ne!(state, before);
        assert_eq!(state.next_id(), 8);
        for undo in undos.into_iter().rev() {
            state.undo(undo);
        }
        assert_eq!(state, before);
    }

    #[test]
    fn bad_ops_change_nothing() {
        let mut state = sample();
        let before = state.clone();
        let bad = [
            Op::Delete { id: 42 },
            Op::Set {
                id: 2,
                index: 0,
                value: Value::from_elem(1, 4),
            },
            Op::Set {
                id: 1,
                index: 0,
                value: Value::from_elem(1, 3),
            },
            Op::Create {
                id: 9,
                kind: ObjectKind::Blob,
                value_size: 0,
                name: "map".into(),
            },
            Op::SetBits {
                id: 2,
                start: u64::MAX,
                count: 2,
                value: true,
            },
        ];
        for op in &bad {
            assert!(state.apply(op).is_err(), "{op:?}");
        }
        assert_eq!(state, before);
    }

    /// One table object (id 1, 4-byte values) holding `page` as page 0, in `pages`' encoding.
    fn one_table_page(page: &[u32; 64], pages: TablePages) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32_le(2); // next id
        out.put_u32_le(1); // one object
        out.put_u32_le(1);
        out.put_u8(ObjectKind::Table as u8);
        put_name(&mut out, "t");
        out.put_u32_le(4);
        out.put_u64_le(1); // one page
        out.put_u64_le(0); // page 0
        match pages {
            TablePages::Whole => page.iter().for_each(|v| out.put_u32_le(*v)),
            TablePages::Masked => {
                let mask = page
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v != 0)
                    .fold(0u64, |m, (i, _)| m | 1 << i);
                out.put_u64_le(mask);
                page.iter()
                    .filter(|v| **v != 0)
                    .for_each(|v| out.put_u32_le(*v));
            }
        }
        out
    }

    #[test]
    fn a_version_2_checkpoint_decodes_to_the_state_a_version_3_one_holds() {
        let mut page = [0u32; 64];
        page[3] = 7;
        page[63] = 1 << 31;
        let whole = one_table_page(&page, TablePages::Whole);
        let masked = one_table_page(&page, TablePages::Masked);
        assert_eq!(masked.len(), whole.len() - 62 * 4 + 8);
        let old = decode_checkpoint(&whole, TablePages::Whole).unwrap();
        let new = decode_checkpoint(&masked, TablePages::Masked).unwrap();
        assert_eq!(old, new);
        assert_eq!(old.encoded_bytes(), masked.len() as u64);
        let mut again = Vec::new();
        encode_checkpoint(&old, &mut again);
        assert_eq!(again, masked, "the next checkpoint is written in version 3");
        // Read with the other version's rule, neither is accepted as the state it holds.
        assert!(decode_checkpoint(&whole, TablePages::Masked).is_err());
        assert!(decode_checkpoint(&masked, TablePages::Whole).is_err());
    }

    #[test]
    fn a_present_entry_stored_as_zeros_is_refused() {
        let mut page = [0u32; 64];
        page[5] = 9;
        let mut masked = one_table_page(&page, TablePages::Masked);
        let mask_at = masked.len() - 4 - 8;
        masked[mask_at..mask_at + 8].copy_from_slice(&(1u64 << 5 | 1 << 6).to_le_bytes());
        masked.extend_from_slice(&0u32.to_le_bytes());
        let error = decode_checkpoint(&masked, TablePages::Masked).unwrap_err();
        assert!(
            error.what.contains("entry 6 as present but all zeros"),
            "{error}"
        );
    }

    #[test]
    fn the_largest_object_id_is_refused_not_overflowed() {
        // Found by the meta_checkpoint fuzz target: id u32::MAX made next_id overflow.
        let mut out = Vec::new();
        out.put_u32_le(1); // next id
        out.put_u32_le(1); // one object
        out.put_u32_le(u32::MAX);
        out.put_u8(ObjectKind::Bitmap as u8);
        put_name(&mut out, "b");
        out.put_u32_le(0);
        out.put_u64_le(0);
        let error = decode_checkpoint(&out, TablePages::Masked).unwrap_err();
        assert!(error.what.contains("in use"), "{error}");
    }

    #[test]
    fn damaged_checkpoints_are_errors_not_panics() {
        let mut out = Vec::new();
        encode_checkpoint(&sample(), &mut out);
        for cut in 0..out.len() {
            assert!(
                decode_checkpoint(&out[..cut], TablePages::Masked).is_err(),
                "cut at {cut}"
            );
        }
        let mut extra = out.clone();
        extra.push(0);
        assert!(decode_checkpoint(&extra, TablePages::Masked).is_err());
    }
}
