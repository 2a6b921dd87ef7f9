//! A mechanical disk drive: zoned serpentine geometry, a three-part seek curve, a platter
//! whose angle is a function of virtual time, and an on-drive command queue (FIFO or SPTF).
//!
//! One command is in service at a time. Its service time is
//! `overhead + move + rotational wait + transfer`, where `move` is the seek (or a head
//! switch, or a reposition on the same track; nothing for a command that continues the last
//! one) plus write settle for a write that moved, and the rotational wait runs from the
//! moment the head is ready until the target sector's start passes under it. Missing a
//! sector by a hair costs a whole revolution: that is the mechanism behind Proximal I/O's
//! strands and its birthday model (Appendix A).
//!
//! The drive holds at most `queue_depth` commands (the one in service included); the rest
//! wait in arrival order in a host-side queue, as they would in the OS block layer.
//! Service starts eagerly, but a choice made at instant `t` is contested by commands that
//! arrive at the same `t`: a strand submitted "at once" is scheduled as a whole.
//!
//! The command overhead is paid only by a command that starts as soon as it reaches the
//! drive; one that waited at the drive was processed while another was being served. A
//! read that continues the previous read is served from the read-ahead stream.
//! docs/simulator.md explains each choice and its calibration.

pub mod geometry;
pub mod presets;
pub mod queue;
pub mod seek;

use std::collections::VecDeque;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::{Completion, DeviceModel, Nanos, Op, Request};
pub use geometry::{Geometry, Location, Zone};
pub use queue::Scheduler;
pub use seek::{SeekCurve, SeekParams};

/// Everything that defines a drive. Presets live in [`presets`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HddParams {
    pub name: String,
    pub rpm: u32,
    pub sector_bytes: u32,
    pub surfaces: u32,
    /// Addressable sectors (the datasheet's LBA count); the zones may hold a few more,
    /// which stay unused as spares do.
    pub capacity_sectors: u64,
    /// Outermost zone first.
    pub zones: Vec<Zone>,
    /// C: cylinders per serpentine band.
    pub band_cylinders: u32,
    pub seek: SeekParams,
    /// Switching heads on the same cylinder.
    pub head_switch: Nanos,
    /// Extra settle before writing after any head movement.
    pub write_settle: Nanos,
    /// Command processing before each command's mechanical work.
    pub command_overhead: Nanos,
    /// After a read the drive goes on reading the following sectors into its buffer, up to
    /// this many bytes, until another command moves the heads; a read that starts where the
    /// last one ended is served from that stream. 0 turns read-ahead off.
    pub read_ahead_bytes: u64,
    /// Commands the drive accepts at once (in service included).
    pub queue_depth: usize,
    pub scheduler: Scheduler,
    /// Positioning for a command on the track the head is already on that does not start
    /// where the last command ended: the firmware runs it as a seek of zero cylinders, and
    /// the head settles before the transfer as after a track switch. So a non-contiguous
    /// access costs a switch whether or not it changes track, which is what makes Proximal
    /// I/O's track-approximate strands cost what its proximal ones do (§2, Figure 1); a
    /// write adds `write_settle` after it as after any move. 0 turns it off.
    pub same_track_reposition: Nanos,
    /// Firmware quirk of Proximal I/O §2.7: the drive reorders only commands that reached
    /// it in ascending LBN order. See [`Job::run`].
    pub order_quirk: bool,
}

/// A command decoded once at submission, so scheduling only does arithmetic.
#[derive(Clone, Copy, Debug)]
struct Job {
    id: u64,
    arrival: u64,
    /// When the command entered the drive's queue; `None` while it waits in the host queue.
    at_drive_since: Option<Nanos>,
    write: bool,
    first_lbn: u64,
    sectors: u64,
    cylinder: u32,
    head: u32,
    /// When, within a revolution, the first sector's start passes under the head.
    start_angle: Nanos,
    transfer: Nanos,
    end_cylinder: u32,
    end_head: u32,
    /// With `order_quirk`: the ascending run the command arrived in. A command below the
    /// one that reached the drive before it opens a new run, and the drive serves runs in
    /// arrival order, reordering only within the oldest. The paper gives the cause (weak
    /// embedded CPUs, a firmware bug), not the mechanism; this one is assumed: the firmware
    /// keeps its queue as an LBN-sorted list that it only appends to, and a command that
    /// would need inserting starts the next list. Always 0 without the quirk.
    run: u64,
}

/// The read-ahead stream left by the last read: sector `next_lbn` comes under the head at
/// `from`, and the sectors after it follow at media speed. While the drive is idle it keeps
/// streaming; the buffer limit only bounds how far ahead a request may start.
#[derive(Clone, Copy, Debug)]
struct ReadAhead {
    next_lbn: u64,
    from: Nanos,
}

#[derive(Clone, Copy, Debug)]
struct InService {
    job: Job,
    start: Nanos,
    /// The positioning time SPTF chose it for.
    positioning: Nanos,
    done_at: Nanos,
}

pub struct Hdd {
    name: String,
    params: HddParams,
    geometry: Geometry,
    seek: SeekCurve,
    revolution: Nanos,
    /// Platter angle at time 0, as a time offset into a revolution.
    phase: Nanos,
    cylinder: u32,
    head: u32,
    /// The LBN after the last command served: a command starting there continues it.
    end_lbn: u64,
    read_ahead: Option<ReadAhead>,
    in_service: Option<InService>,
    /// Commands at the drive, waiting, in arrival order.
    queued: Vec<Job>,
    /// Commands beyond the queue depth, in arrival order.
    host_queue: VecDeque<Job>,
    /// Completions reached while catching up in `submit`, not yet reported.
    finished: VecDeque<Completion>,
    next_arrival: u64,
    /// With `order_quirk`: the current ascending run and the LBN that last reached the drive.
    run: u64,
    last_lbn_at_drive: Option<u64>,
    busy_done: Nanos,
    clock: Nanos,
}

impl Hdd {
    /// A drive with the platter at angle 0 and the heads on cylinder 0.
    pub fn new(params: HddParams) -> Self {
        assert!(params.rpm > 0 && params.sector_bytes > 0 && params.queue_depth > 0);
        let revolution = 60_000_000_000 / Nanos::from(params.rpm);
        // Skew covers a write's switch too, so sequential writes stream as reads do.
        let switch = params.seek.settle.max(params.head_switch) + params.write_settle;
        let geometry = Geometry::new(
            &params.zones,
            params.surfaces,
            params.band_cylinders,
            switch as f64 / revolution as f64,
        );
        assert!(
            geometry.total_sectors() >= params.capacity_sectors,
            "{}: zones hold fewer sectors than the capacity",
            params.name
        );
        let seek = fit_seek(&params.seek, &geometry);
        Self {
            name: params.name.clone(),
            params,
            geometry,
            seek,
            revolution,
            phase: 0,
            cylinder: 0,
            head: 0,
            end_lbn: 0,
            read_ahead: None,
            in_service: None,
            queued: Vec::new(),
            host_queue: VecDeque::new(),
            finished: VecDeque::new(),
            next_arrival: 0,
            run: 0,
            last_lbn_at_drive: None,
            busy_done: 0,
            clock: 0,
        }
    }

    /// A drive whose initial platter angle and arm position come from `seed`.
    pub fn with_seed(params: HddParams, seed: u64) -> Self {
        let mut drive = Self::new(params);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        drive.phase = rng.random_range(0..drive.revolution);
        drive.cylinder = rng.random_range(0..drive.geometry.cylinders());
        drive
    }

    pub fn params(&self) -> &HddParams {
        &self.params
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn seek_curve(&self) -> &SeekCurve {
        &self.seek
    }

    pub fn revolution(&self) -> Nanos {
        self.revolution
    }

    /// Changes the queue policy; takes effect at the next scheduling decision.
    pub fn set_scheduler(&mut self, scheduler: Scheduler) {
        self.params.scheduler = scheduler;
    }

    /// Changes how many commands the drive holds; takes effect at the next submission or
    /// completion.
    pub fn set_queue_depth(&mut self, depth: usize) {
        assert!(depth > 0);
        self.params.queue_depth = depth;
    }

    /// Time for `sectors` to pass under the head on a track of `sectors_per_track`.
    fn sectors_time(&self, sectors: u64, sectors_per_track: u32) -> Nanos {
        sectors * self.revolution / u64::from(sectors_per_track)
    }

    fn decode(&mut self, request: &Request) -> Job {
        let sector = u64::from(self.params.sector_bytes);
        let first = request.offset / sector;
        let count = (request.offset + request.len.max(1)).div_ceil(sector) - first;
        let end = first + count - 1;
        assert!(
            end < self.params.capacity_sectors,
            "request past the end of {}",
            self.name
        );
        let start = self.geometry.locate(first);
        let spt = start.sectors_per_track;
        // Crossing to the next track costs the skew: the next track's first sector is
        // placed exactly one track switch later.
        let crossings = (u64::from(start.sector) + count - 1) / u64::from(spt);
        let skew = u64::from(self.geometry.skew_sectors(first));
        let transfer = self.sectors_time(count + crossings * skew, spt);
        let (end_cylinder, end_head) = if crossings == 0 {
            (start.cylinder, start.head)
        } else {
            let last = self.geometry.locate(end);
            (last.cylinder, last.head)
        };
        self.next_arrival += 1;
        Job {
            id: request.id,
            arrival: self.next_arrival,
            at_drive_since: None,
            write: request.op == Op::Write,
            first_lbn: first,
            sectors: count,
            cylinder: start.cylinder,
            head: start.head,
            start_angle: self.sectors_time(u64::from(start.slot), spt),
            transfer,
            end_cylinder,
            end_head,
            run: 0,
        }
    }

    /// Overhead, head movement and rotational wait for `job` if started at `now` from the
    /// current head position. A command that waited at the drive while another was served
    /// has had its processing done in the background (tagged queueing overlaps it with the
    /// other command's mechanics); one that arrives to start at once pays it.
    fn positioning(&self, job: &Job, now: Nanos) -> Nanos {
        if self.streams(job).is_some() {
            return 0;
        }
        let movement = self.movement(job);
        let ready = now + self.overhead(job, now) + movement;
        let angle = (ready + self.phase) % self.revolution;
        // Both angles lie in [0, revolution) (a slot is below its track's sector count), so
        // the remainder of their difference plus one revolution is one conditional
        // subtraction: the same value without a division, on the SPTF pick's hot path.
        debug_assert!(job.start_angle < self.revolution && angle < self.revolution);
        let wait = job.start_angle + self.revolution - angle;
        let wait = if wait >= self.revolution {
            wait - self.revolution
        } else {
            wait
        };
        ready + wait - now
    }

    /// Head movement before `job`'s transfer: a seek, a head switch, or a reposition on the
    /// same track, then write settle for a write that moved. Only a command that starts
    /// where the last one ended needs none.
    fn movement(&self, job: &Job) -> Nanos {
        let distance = job.cylinder.abs_diff(self.cylinder);
        let switched = job.head != self.head;
        let changes_track = distance > 0 || switched;
        let mut movement = if changes_track {
            self.seek
                .time(distance)
                .max(if switched { self.params.head_switch } else { 0 })
        } else if job.first_lbn != self.end_lbn {
            self.params.same_track_reposition
        } else {
            0
        };
        if job.write && (changes_track || movement > 0) {
            movement += self.params.write_settle;
        }
        movement
    }

    fn overhead(&self, job: &Job, now: Nanos) -> Nanos {
        match job.at_drive_since {
            Some(since) if since < now => 0,
            _ => self.params.command_overhead,
        }
    }

    /// The read-ahead stream `job` continues, if it is a read starting where the stream is.
    fn streams(&self, job: &Job) -> Option<ReadAhead> {
        let stream = self.read_ahead?;
        let fits =
            job.sectors * u64::from(self.params.sector_bytes) <= self.params.read_ahead_bytes;
        (!job.write && fits && job.first_lbn == stream.next_lbn).then_some(stream)
    }

    /// When `job`, started at `now`, completes; `positioning` is
    /// `self.positioning(job, now)`, which the caller has already worked out.
    fn completion_time(&self, job: &Job, now: Nanos, positioning: Nanos) -> Nanos {
        match self.streams(job) {
            Some(stream) => (now + self.overhead(job, now)).max(stream.from + job.transfer),
            None => now + positioning + job.transfer,
        }
    }

    fn start_next(&mut self, now: Nanos) {
        debug_assert!(self.in_service.is_none());
        if self.queued.is_empty() {
            return;
        }
        // Under the order quirk only the oldest run is eligible: the others cost "never".
        let oldest_run = self.queued.iter().map(|job| job.run).min();
        // SPTF picks the cheapest command, so the smallest cost it saw is the positioning
        // of the one it picked: kept rather than worked out again.
        let mut cheapest = Nanos::MAX;
        let index = queue::pick(self.params.scheduler, &self.queued, |job| {
            let cost = if Some(job.run) == oldest_run {
                self.positioning(job, now)
            } else {
                Nanos::MAX
            };
            cheapest = cheapest.min(cost);
            cost
        });
        let job = self.queued.remove(index);
        if self.params.scheduler == Scheduler::Sptf && cheapest != Nanos::MAX {
            debug_assert_eq!(cheapest, self.positioning(&job, now));
            self.serve_positioned(job, now, cheapest);
        } else {
            self.serve(job, now);
        }
    }

    fn serve(&mut self, job: Job, now: Nanos) {
        let positioning = self.positioning(&job, now);
        self.serve_positioned(job, now, positioning);
    }

    /// [`Hdd::serve`] with `job`'s positioning from now already worked out.
    fn serve_positioned(&mut self, job: Job, now: Nanos, positioning: Nanos) {
        self.in_service = Some(InService {
            job,
            start: now,
            positioning,
            done_at: self.completion_time(&job, now, positioning),
        });
    }

    fn refill(&mut self, now: Nanos) {
        let busy = usize::from(self.in_service.is_some());
        while self.queued.len() + busy < self.params.queue_depth {
            match self.host_queue.pop_front() {
                Some(job) => {
                    let run = self.run_of(job.first_lbn);
                    self.queued.push(Job {
                        at_drive_since: Some(now),
                        run,
                        ..job
                    });
                }
                None => break,
            }
        }
    }

    /// The ascending run a command for `lbn` reaching the drive now joins (always 0 without
    /// the order quirk).
    fn run_of(&mut self, lbn: u64) -> u64 {
        if !self.params.order_quirk {
            return 0;
        }
        if self.last_lbn_at_drive.is_some_and(|last| lbn < last) {
            self.run += 1;
        }
        self.last_lbn_at_drive = Some(lbn);
        self.run
    }

    /// Completes everything due at or before `now`, starting each next command on time.
    fn catch_up(&mut self, now: Nanos) {
        debug_assert!(now >= self.clock, "time went backwards");
        self.clock = now;
        while let Some(service) = self.in_service {
            if service.done_at > now {
                break;
            }
            self.in_service = None;
            self.finished.push_back(Completion {
                id: service.job.id,
                at: service.done_at,
            });
            self.busy_done += service.done_at - service.start;
            self.cylinder = service.job.end_cylinder;
            self.head = service.job.end_head;
            self.end_lbn = service.job.first_lbn + service.job.sectors;
            self.read_ahead = self.stream_after(&service);
            self.refill(service.done_at);
            self.start_next(service.done_at);
        }
    }

    /// Where the read-ahead stream stands after `service`: a read leaves (or extends) one, a
    /// write ends it.
    fn stream_after(&self, service: &InService) -> Option<ReadAhead> {
        let job = &service.job;
        if job.write || self.params.read_ahead_bytes == 0 {
            return None;
        }
        let from = match self.streams(job) {
            Some(stream) => stream.from + job.transfer,
            None => service.done_at,
        };
        Some(ReadAhead {
            next_lbn: job.first_lbn + job.sectors,
            from,
        })
    }

    /// SPTF's choice at `now` covers every command present at `now`. The last `newcomers`
    /// queued commands reached the drive at `now`; one replaces the command in service if it
    /// started at `now` and the newcomer is strictly cheaper. Ties keep the earlier arrival,
    /// as `queue::pick` does, so the outcome equals picking again over all of them.
    fn contest_choice_at(&mut self, now: Nanos, newcomers: usize) {
        let Some(service) = self.in_service else {
            return;
        };
        if service.start != now || self.params.scheduler != Scheduler::Sptf {
            return;
        }
        let mut best = (service.positioning, None);
        for index in self.queued.len() - newcomers..self.queued.len() {
            if self.queued[index].run != service.job.run {
                continue; // the order quirk: a later run waits for this one
            }
            let cost = self.positioning(&self.queued[index], now);
            if cost < best.0 {
                best = (cost, Some(index));
            }
        }
        if let Some(index) = best.1 {
            let job = self.queued.remove(index);
            let place = self
                .queued
                .partition_point(|j| j.arrival < service.job.arrival);
            self.queued.insert(place, service.job);
            self.serve(job, now);
        }
    }
}

/// Fits the seek curve to the drive's average seek over random LBN pairs: 256 LBN quantiles
/// give the cylinder distribution (outer zones hold more LBNs), and all their pairs give the
/// distances.
fn fit_seek(params: &SeekParams, geometry: &Geometry) -> SeekCurve {
    const QUANTILES: u64 = 256;
    let total = geometry.total_sectors();
    let cylinders: Vec<u32> = (0..QUANTILES)
        .map(|i| {
            geometry
                .locate((2 * i + 1) * total / (2 * QUANTILES))
                .cylinder
        })
        .collect();
    let mut distances = Vec::with_capacity(cylinders.len() * cylinders.len());
    for &a in &cylinders {
        distances.extend(cylinders.iter().map(|&b| a.abs_diff(b)));
    }
    SeekCurve::fit(params, geometry.cylinders() - 1, &distances)
}

impl DeviceModel for Hdd {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity(&self) -> u64 {
        self.params.capacity_sectors * u64::from(self.params.sector_bytes)
    }

    fn submit(&mut self, now: Nanos, request: Request) {
        self.catch_up(now);
        let job = self.decode(&request);
        self.host_queue.push_back(job);
        let queued_before = self.queued.len();
        self.refill(now);
        self.contest_choice_at(now, self.queued.len() - queued_before);
        if self.in_service.is_none() {
            self.start_next(now);
        }
    }

    fn next_completion(&self) -> Option<Nanos> {
        match self.finished.front() {
            Some(done) => Some(done.at),
            None => self.in_service.map(|s| s.done_at),
        }
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        self.catch_up(now);
        done.extend(self.finished.drain(..));
    }

    fn outstanding(&self) -> usize {
        self.finished.len()
            + usize::from(self.in_service.is_some())
            + self.queued.len()
            + self.host_queue.len()
    }

    fn busy_time(&self) -> Nanos {
        let current = self.in_service.map_or(0, |s| {
            self.clock.saturating_sub(s.start).min(s.done_at - s.start)
        });
        self.busy_done + current
    }
}
