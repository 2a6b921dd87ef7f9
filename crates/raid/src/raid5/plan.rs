//! The planner: how one stripe's part of a request becomes member I/O. Pure, no I/O.
//!
//! A write to a stripe touches some data chunks over some byte range each; the parity must
//! change over the union of those ranges, the *rows* `[lo, hi)`. Three ways to get the new
//! parity, chosen by counting member reads:
//!
//! - **full-stripe**: the write covers every data chunk whole, so parity is the XOR of the new
//!   data. No reads.
//! - **read-modify-write** (RMW): read the old contents of the changed ranges and the old
//!   parity; new parity = old parity ⊕ old data ⊕ new data. Reads = touched chunks + 1.
//! - **reconstruct-write** (RCW): read the rows of every data chunk the write does not cover
//!   whole; new parity = XOR of all data rows. Reads = chunks not fully covered.
//!
//! RCW wins when strictly fewer reads (on 3 members a one-chunk write reads 1 chunk instead
//! of 2); ties go to RMW, whose reads are the same size as the write. With one member failed
//! for this stripe ("degraded"):
//! - parity member failed → write the data only (nothing to keep consistent, nothing to read);
//! - an untouched data member failed → RMW (RCW would need it);
//! - a touched data member failed → its old rows outside the write are reconstructed from
//!   every surviving member, then parity is the XOR of all data rows. If the write covers its
//!   rows whole, plain RCW without it suffices.

/// The part of a write that lands in one data chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataPiece {
    pub member: usize,
    /// Byte range inside the chunk.
    pub start: u64,
    pub len: u64,
    /// Offset of these bytes in the stripe's part of the request.
    pub src: u64,
}

/// A range of one member's chunk in this stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberRange {
    pub member: usize,
    pub start: u64,
    pub len: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    FullStripe,
    ReadModifyWrite,
    ReconstructWrite,
    /// The parity member is failed: data only.
    DataOnly,
}

/// Everything the data path needs to update one stripe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritePlan {
    pub stripe: u64,
    pub kind: WriteKind,
    pub parity: usize,
    /// The member unusable for this stripe, if any.
    pub failed: Option<usize>,
    /// Parity rows `[lo, hi)`.
    pub lo: u64,
    pub hi: u64,
    pub pieces: Vec<DataPiece>,
    pub reads: Vec<MemberRange>,
}

/// Builds the plan for writing `len` bytes at `within` (offset in the stripe's data).
pub fn plan_write(
    chunk: u64,
    members: usize,
    parity: usize,
    stripe: u64,
    within: u64,
    len: u64,
    failed: Option<usize>,
) -> WritePlan {
    assert!(len > 0 && within + len <= chunk * (members as u64 - 1));
    let data_member = |r: usize| if r < parity { r } else { r + 1 };
    let mut pieces = Vec::new();
    let (mut pos, end) = (within, within + len);
    while pos < end {
        let r = (pos / chunk) as usize;
        let start = pos % chunk;
        let take = (chunk - start).min(end - pos);
        pieces.push(DataPiece {
            member: data_member(r),
            start,
            len: take,
            src: pos - within,
        });
        pos += take;
    }
    let lo = pieces.iter().map(|p| p.start).min().expect("a piece");
    let hi = pieces
        .iter()
        .map(|p| p.start + p.len)
        .max()
        .expect("a piece");
    let covers = |m: usize| {
        pieces
            .iter()
            .any(|p| p.member == m && p.start <= lo && p.start + p.len >= hi)
    };
    let data: Vec<usize> = (0..members - 1).map(data_member).collect();
    let rows = |m: usize| MemberRange {
        member: m,
        start: lo,
        len: hi - lo,
    };
    let touched = |m: usize| pieces.iter().any(|p| p.member == m);
    let full = lo == 0 && hi == chunk && data.iter().all(|&m| covers(m));
    let rmw_reads: Vec<MemberRange> = pieces
        .iter()
        .map(|p| MemberRange {
            member: p.member,
            start: p.start,
            len: p.len,
        })
        .chain(std::iter::once(rows(parity)))
        .collect();
    let uncovered: Vec<MemberRange> = data
        .iter()
        .filter(|&&m| !covers(m) && Some(m) != failed)
        .map(|&m| rows(m))
        .collect();
    let (kind, reads) = match failed {
        Some(f) if f == parity => (WriteKind::DataOnly, Vec::new()),
        _ if full => (WriteKind::FullStripe, Vec::new()),
        Some(f) if !touched(f) => (WriteKind::ReadModifyWrite, rmw_reads),
        Some(f) if covers(f) => (WriteKind::ReconstructWrite, uncovered),
        Some(f) => {
            // The failed chunk's old rows must be rebuilt from every survivor.
            let all = (0..members).filter(|&m| m != f).map(rows).collect();
            (WriteKind::ReconstructWrite, all)
        }
        None if uncovered.len() < rmw_reads.len() => (WriteKind::ReconstructWrite, uncovered),
        None => (WriteKind::ReadModifyWrite, rmw_reads),
    };
    WritePlan {
        stripe,
        kind,
        parity,
        failed,
        lo,
        hi,
        pieces,
        reads,
    }
}

impl WritePlan {
    /// Member writes this plan issues.
    pub fn member_writes(&self) -> usize {
        let data = self
            .pieces
            .iter()
            .filter(|p| Some(p.member) != self.failed)
            .count();
        data + usize::from(self.kind != WriteKind::DataOnly)
    }

    /// Computes what to write from the reads (in `reads` order) and the new data. Returns
    /// (member, start in chunk, bytes); parity last unless `DataOnly`.
    pub fn compute(&self, read: &[Vec<u8>], data: &[u8]) -> Vec<(usize, u64, Vec<u8>)> {
        assert_eq!(read.len(), self.reads.len());
        let (lo, width) = (self.lo, (self.hi - self.lo) as usize);
        let new = |p: &DataPiece| &data[p.src as usize..(p.src + p.len) as usize];
        let mut out: Vec<(usize, u64, Vec<u8>)> = self
            .pieces
            .iter()
            .filter(|p| Some(p.member) != self.failed)
            .map(|p| (p.member, p.start, new(p).to_vec()))
            .collect();
        let parity = match self.kind {
            WriteKind::DataOnly => return out,
            WriteKind::ReadModifyWrite => {
                let mut parity = read.last().expect("old parity").clone();
                for (p, old) in self.pieces.iter().zip(read) {
                    let at = (p.start - lo) as usize;
                    xor_into(&mut parity[at..at + p.len as usize], old);
                    xor_into(&mut parity[at..at + p.len as usize], new(p));
                }
                parity
            }
            WriteKind::FullStripe | WriteKind::ReconstructWrite => {
                self.rows_parity(read, data, width)
            }
        };
        assert_eq!(parity.len(), width);
        out.push((self.parity, lo, parity));
        out
    }

    /// New parity as the XOR of every data chunk's new rows (full-stripe and RCW).
    fn rows_parity(&self, read: &[Vec<u8>], data: &[u8], width: usize) -> Vec<u8> {
        let mut rows: std::collections::BTreeMap<usize, Vec<u8>> =
            std::collections::BTreeMap::new();
        for (range, bytes) in self.reads.iter().zip(read) {
            assert_eq!(range.len as usize, width);
            rows.insert(range.member, bytes.clone());
        }
        // A failed data member that the write does not cover whole: its old rows are the
        // XOR of every survivor's rows (parity included), read before anything changed.
        if let Some(f) = self.failed.filter(|&f| f != self.parity) {
            if !rows.contains_key(&f) && rows.contains_key(&self.parity) {
                let mut old = vec![0u8; width];
                for bytes in rows.values() {
                    xor_into(&mut old, bytes);
                }
                rows.insert(f, old);
            }
        }
        rows.remove(&self.parity);
        for p in &self.pieces {
            let row = rows.entry(p.member).or_insert_with(|| vec![0u8; width]);
            let at = (p.start - self.lo) as usize;
            row[at..at + p.len as usize]
                .copy_from_slice(&data[p.src as usize..(p.src + p.len) as usize]);
        }
        let mut parity = vec![0u8; width];
        for row in rows.values() {
            xor_into(&mut parity, row);
        }
        parity
    }
}

/// A piece of a read: straight from a member, or rebuilt from all the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadSource {
    Direct {
        member: usize,
    },
    /// XOR of these members' same range (every member but the failed one).
    Reconstruct {
        from: Vec<usize>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPart {
    pub source: ReadSource,
    /// The data member whose bytes these are.
    pub member: usize,
    pub start: u64,
    pub len: u64,
    /// Offset in the stripe's part of the request.
    pub dst: u64,
}

/// Plans reading `len` bytes at `within` of a stripe whose member `failed` is unusable.
pub fn plan_read(
    chunk: u64,
    members: usize,
    parity: usize,
    within: u64,
    len: u64,
    failed: Option<usize>,
) -> Vec<ReadPart> {
    let write = plan_write(chunk, members, parity, 0, within, len, None);
    write
        .pieces
        .iter()
        .map(|p| {
            let source = if Some(p.member) == failed {
                let from = (0..members).filter(|&m| m != p.member).collect();
                ReadSource::Reconstruct { from }
            } else {
                ReadSource::Direct { member: p.member }
            };
            ReadPart {
                source,
                member: p.member,
                start: p.start,
                len: p.len,
                dst: p.src,
            }
        })
        .collect()
}

pub fn xor_into(target: &mut [u8], source: &[u8]) {
    assert_eq!(target.len(), source.len());
    // Word-at-a-time; the compiler vectorises this loop.
    let mut t = target.chunks_exact_mut(8);
    let mut s = source.chunks_exact(8);
    for (a, b) in (&mut t).zip(&mut s) {
        let x =
            u64::from_ne_bytes(a.try_into().unwrap()) ^ u64::from_ne_bytes(b.try_into().unwrap());
        a.copy_from_slice(&x.to_ne_bytes());
    }
    for (a, b) in t.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u64 = 4096;

    fn reads(plan: &WritePlan) -> Vec<(usize, u64, u64)> {
        plan.reads
            .iter()
            .map(|r| (r.member, r.start, r.len))
            .collect()
    }

    #[test]
    fn small_write_on_four_members_is_rmw_two_reads_two_writes() {
        // Stripe 0 of 4 members: parity on 3, data 0,1,2 on members 0,1,2.
        let plan = plan_write(C, 4, 3, 0, C + 512, 1024, None);
        assert_eq!(plan.kind, WriteKind::ReadModifyWrite);
        assert_eq!(reads(&plan), vec![(1, 512, 1024), (3, 512, 1024)]);
        assert_eq!(plan.member_writes(), 2);
    }

    #[test]
    fn small_write_on_three_members_reconstructs_from_one_read() {
        let plan = plan_write(C, 3, 2, 0, 0, 4096, None);
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
        assert_eq!(reads(&plan), vec![(1, 0, 4096)]);
        assert_eq!(plan.member_writes(), 2);
    }

    #[test]
    fn whole_stripe_reads_nothing_and_writes_every_member() {
        let plan = plan_write(C, 5, 1, 3, 0, 4 * C, None);
        assert_eq!(plan.kind, WriteKind::FullStripe);
        assert!(plan.reads.is_empty());
        assert_eq!(plan.member_writes(), 5);
    }

    #[test]
    fn three_of_four_chunks_reads_the_fourth() {
        // 5 members, write chunks 0..3 whole: RCW reads only chunk 3 (1 read vs RMW's 4).
        let plan = plan_write(C, 5, 4, 0, 0, 3 * C, None);
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
        assert_eq!(reads(&plan), vec![(3, 0, C)]);
    }

    #[test]
    fn degraded_variants() {
        // Parity member failed: data only.
        let plan = plan_write(C, 4, 3, 0, 0, 512, Some(3));
        assert_eq!(
            (plan.kind, plan.reads.len(), plan.member_writes()),
            (WriteKind::DataOnly, 0, 1)
        );
        // Untouched data member failed: RMW.
        let plan = plan_write(C, 4, 3, 0, 0, 512, Some(2));
        assert_eq!(plan.kind, WriteKind::ReadModifyWrite);
        // Touched data member failed, covering its rows: RCW without it.
        let plan = plan_write(C, 4, 3, 0, 0, 512, Some(0));
        assert_eq!(reads(&plan), vec![(1, 0, 512), (2, 0, 512)]);
        assert_eq!(plan.member_writes(), 1);
        // Touched data member failed, not covering rows [0, C): read every survivor.
        let plan = plan_write(C, 4, 3, 0, C - 512, 1024, Some(0));
        assert_eq!(reads(&plan), vec![(1, 0, C), (2, 0, C), (3, 0, C)]);
        assert_eq!(plan.member_writes(), 2);
    }

    /// Runs a plan against an in-memory stripe and checks parity = XOR of data afterwards,
    /// and that the failed member's content stays derivable.
    fn apply(members: usize, within: u64, len: u64, failed: Option<usize>) {
        let parity = members - 1;
        let mut stripe: Vec<Vec<u8>> = (0..members)
            .map(|m| {
                (0..C)
                    .map(|i| (i as u8).wrapping_mul(m as u8 + 3))
                    .collect()
            })
            .collect();
        let mut p = vec![0u8; C as usize];
        for chunk in &stripe[..parity] {
            xor_into(&mut p, chunk);
        }
        stripe[parity] = p;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        let plan = plan_write(C, members, parity, 0, within, len, failed);
        let read: Vec<Vec<u8>> = plan
            .reads
            .iter()
            .map(|r| {
                assert_ne!(Some(r.member), failed, "{plan:?} reads the failed member");
                stripe[r.member][r.start as usize..(r.start + r.len) as usize].to_vec()
            })
            .collect();
        let mut expect = stripe.clone();
        for piece in &plan.pieces {
            expect[piece.member][piece.start as usize..(piece.start + piece.len) as usize]
                .copy_from_slice(&data[piece.src as usize..(piece.src + piece.len) as usize]);
        }
        let mut p = vec![0u8; C as usize];
        for chunk in &expect[..parity] {
            xor_into(&mut p, chunk);
        }
        expect[parity] = p;
        for (m, start, bytes) in plan.compute(&read, &data) {
            assert_ne!(Some(m), failed);
            stripe[m][start as usize..start as usize + bytes.len()].copy_from_slice(&bytes);
        }
        if let Some(f) = failed {
            let mut rebuilt = vec![0u8; C as usize];
            for m in (0..members).filter(|&m| m != f) {
                xor_into(&mut rebuilt, &stripe[m]);
            }
            stripe[f] = rebuilt;
        }
        assert!(stripe == expect, "{plan:?} leaves the stripe wrong");
    }

    #[test]
    fn every_kind_keeps_parity_consistent() {
        for members in 3..=5 {
            let data = C * (members as u64 - 1);
            for &(within, len) in &[
                (0, data),
                (0, 512),
                (C - 512, 1024),
                (512, data - 1024),
                (C, C),
            ] {
                for failed in std::iter::once(None).chain((0..members).map(Some)) {
                    apply(members, within, len, failed);
                }
            }
        }
    }
}
