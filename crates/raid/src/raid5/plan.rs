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
    let pieces = pieces_of(chunk, members, parity, within, len, 0);
    plan_pieces(chunk, members, parity, stripe, pieces, failed)
}

/// Plans several disjoint writes to one stripe, given as `(within, len)` with their data laid
/// end to end in this order. Writes whose parity rows overlap or touch share one plan, so
/// each parity row is read and written once for all of them (a batch of small writes to a
/// stripe costs one parity update per group, not one per write); groups are independent.
/// A single write gives exactly [`plan_write`]'s plan.
pub fn plan_writes(
    chunk: u64,
    members: usize,
    parity: usize,
    stripe: u64,
    writes: &[(u64, u64)],
    failed: Option<usize>,
) -> Vec<WritePlan> {
    let mut by_position: Vec<(u64, u64)> = writes.to_vec();
    by_position.sort_unstable();
    for pair in by_position.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0,
            "overlapping writes {pair:?}"
        );
    }
    // Each write's pieces, sources offset by the data of the writes before it.
    let mut src = 0;
    let mut each: Vec<(u64, u64, Vec<DataPiece>)> = writes
        .iter()
        .map(|&(within, len)| {
            let pieces = pieces_of(chunk, members, parity, within, len, src);
            src += len;
            let (lo, hi) = rows_of(&pieces);
            (lo, hi, pieces)
        })
        .collect();
    each.sort_by_key(|&(lo, hi, _)| (lo, hi));
    let mut groups: Vec<(u64, Vec<DataPiece>)> = Vec::new();
    for (lo, hi, pieces) in each {
        match groups.last_mut() {
            Some((group_hi, group)) if lo <= *group_hi => {
                *group_hi = (*group_hi).max(hi);
                group.extend(pieces);
            }
            _ => groups.push((hi, pieces)),
        }
    }
    groups
        .into_iter()
        .map(|(_, pieces)| plan_pieces(chunk, members, parity, stripe, pieces, failed))
        .collect()
}

/// The parity rows `[lo, hi)` of `pieces`: their least start and greatest end.
fn rows_of(pieces: &[DataPiece]) -> (u64, u64) {
    let lo = pieces.iter().map(|p| p.start).min().expect("a piece");
    let hi = pieces
        .iter()
        .map(|p| p.start + p.len)
        .max()
        .expect("a piece");
    (lo, hi)
}

/// The data pieces of `len` bytes at `within`, their sources counted from `src`.
fn pieces_of(
    chunk: u64,
    members: usize,
    parity: usize,
    within: u64,
    len: u64,
    src: u64,
) -> Vec<DataPiece> {
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
            src: src + pos - within,
        });
        pos += take;
    }
    pieces
}

/// The plan for disjoint `pieces` whose parity rows are `[lo, hi)`, their least start and
/// greatest end. A member counts as covering the rows only through a single piece: two
/// pieces that together cover them are read as if they did not (correct, one read more).
fn plan_pieces(
    chunk: u64,
    members: usize,
    parity: usize,
    stripe: u64,
    pieces: Vec<DataPiece>,
    failed: Option<usize>,
) -> WritePlan {
    let data_member = |r: usize| if r < parity { r } else { r + 1 };
    let (lo, hi) = rows_of(&pieces);
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
        apply_writes(members, &[(within, len)], failed);
    }

    /// [`apply`] for a batch: every group's reads come from the stripe as it was (the data
    /// path reads all groups before writing any), then every group's writes land.
    fn apply_writes(members: usize, writes: &[(u64, u64)], failed: Option<usize>) {
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
        let total: u64 = writes.iter().map(|w| w.1).sum();
        let data: Vec<u8> = (0..total).map(|i| (i * 7 + 1) as u8).collect();
        let plans = plan_writes(C, members, parity, 0, writes, failed);
        let mut expect = stripe.clone();
        let (mut at, mut src) = (Vec::new(), 0);
        for &(within, len) in writes {
            at.push((within, src, len));
            src += len;
        }
        for (within, src, len) in at {
            for i in 0..len {
                let pos = within + i;
                let (r, off) = ((pos / C) as usize, (pos % C) as usize);
                let member = if r < parity { r } else { r + 1 };
                expect[member][off] = data[(src + i) as usize];
            }
        }
        let mut p = vec![0u8; C as usize];
        for chunk in &expect[..parity] {
            xor_into(&mut p, chunk);
        }
        expect[parity] = p;
        let mut out = Vec::new();
        for plan in &plans {
            let read: Vec<Vec<u8>> = plan
                .reads
                .iter()
                .map(|r| {
                    assert_ne!(Some(r.member), failed, "{plan:?} reads the failed member");
                    stripe[r.member][r.start as usize..(r.start + r.len) as usize].to_vec()
                })
                .collect();
            out.extend(plan.compute(&read, &data));
        }
        for (m, start, bytes) in out {
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
        assert!(stripe == expect, "{plans:?} leave the stripe wrong");
    }

    #[test]
    fn one_write_in_a_batch_is_planned_as_alone() {
        for &(within, len) in &[(0, 4 * C), (C + 512, 1024), (C - 512, 1024), (512, 2 * C)] {
            for failed in [None, Some(0), Some(4)] {
                let alone = plan_write(C, 5, 4, 7, within, len, failed);
                assert_eq!(
                    plan_writes(C, 5, 4, 7, &[(within, len)], failed),
                    vec![alone]
                );
            }
        }
    }

    #[test]
    fn small_writes_on_the_same_rows_share_one_parity_update() {
        // 5 members, parity on 4: three 512-byte writes at row 1024 of chunks 0, 1 and 3.
        let writes = [(1024, 512), (C + 1024, 512), (3 * C + 1024, 512)];
        let plans = plan_writes(C, 5, 4, 0, &writes, None);
        assert_eq!(plans.len(), 1);
        let plan = &plans[0];
        // RCW: only chunk 2's rows are read (RMW would read three data ranges and parity).
        assert_eq!(plan.kind, WriteKind::ReconstructWrite);
        assert_eq!(reads(plan), vec![(2, 1024, 512)]);
        assert_eq!(plan.member_writes(), 4);
        // Two writes on the same rows of a wide array: RMW, parity read and written once.
        let plans = plan_writes(C, 8, 7, 0, &[(0, 512), (3 * C, 512)], None);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].kind, WriteKind::ReadModifyWrite);
        assert_eq!(
            reads(&plans[0]),
            vec![(0, 0, 512), (3, 0, 512), (7, 0, 512)]
        );
        assert_eq!(plans[0].member_writes(), 3);
    }

    #[test]
    fn writes_on_rows_apart_are_planned_apart_and_touching_rows_merge() {
        let plans = plan_writes(C, 5, 4, 0, &[(C + 3072, 512), (0, 512)], None);
        let rows: Vec<(u64, u64)> = plans.iter().map(|p| (p.lo, p.hi)).collect();
        assert_eq!(rows, vec![(0, 512), (3072, 3584)]);
        // Data of the second write (row 0) comes after the first's in the buffer.
        assert_eq!(plans[0].pieces[0].src, 512);
        let plans = plan_writes(C, 5, 4, 0, &[(512, 512), (2 * C, 512)], None);
        let rows: Vec<(u64, u64)> = plans.iter().map(|p| (p.lo, p.hi)).collect();
        assert_eq!(rows, vec![(0, 1024)]);
    }

    #[test]
    #[should_panic(expected = "overlapping writes")]
    fn overlapping_writes_are_a_bug_of_the_caller() {
        plan_writes(C, 5, 4, 0, &[(0, 1024), (512, 512)], None);
    }

    proptest::proptest! {
        /// Any set of disjoint writes, on any member count, with any member failed, leaves
        /// every data chunk as written and the parity consistent.
        #[test]
        fn batches_keep_parity_consistent(
            members in 3usize..=6,
            cuts in proptest::collection::vec((0u64..64, 1u64..80, proptest::bool::ANY), 1..12),
            failed in proptest::option::of(0usize..6),
            seed in 0u64..1000,
        ) {
            // Disjoint writes in 128-byte units, taken in a shuffled order.
            let units = (C / 128) * (members as u64 - 1);
            let mut writes = Vec::new();
            let mut pos = 0;
            for (gap, len, keep) in cuts {
                let start = pos + gap % 8;
                let len = len.min(units.saturating_sub(start));
                if len == 0 {
                    break;
                }
                if keep {
                    writes.push((start * 128, len * 128));
                }
                pos = start + len;
            }
            proptest::prop_assume!(!writes.is_empty());
            let n = writes.len();
            for i in 0..n {
                writes.swap(i, (seed as usize + i * 7) % n);
            }
            let failed = failed.filter(|&f| f < members);
            apply_writes(members, &writes, failed);
        }
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
