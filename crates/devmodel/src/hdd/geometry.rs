//! Where each LBN lives on the platters: zones of constant sectors per track, and the
//! surface-serpentine layout of Proximal I/O §2 (Schlosser et al.): within a zone, cylinders
//! form bands of C; LBNs fill track after track on one surface across the band, then move
//! to the next surface and start again at the band's first cylinder, then the next band.
//!
//! The seed text leaves open whether the next surface runs the band backwards or restarts
//! (digest §2.2 [U]); "a different surface C cylinders away" reads as a restart, so a
//! sequential run pays a seek of C - 1 cylinders (a plateau seek) once per C tracks.
//!
//! Each track's first LBN is skewed by `skew_sectors` against the previous track in LBN
//! order, so a sequential stream does not lose a revolution at a track or surface switch.

/// A run of cylinders with the same number of sectors per track (outermost zone first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Zone {
    pub cylinders: u32,
    pub sectors_per_track: u32,
}

/// Physical position of one sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub cylinder: u32,
    pub head: u32,
    /// Logical index on the track (0 = the track's first LBN).
    pub sector: u32,
    /// Angular slot on the platter, 0..sectors_per_track, after the track's skew.
    pub slot: u32,
    pub sectors_per_track: u32,
}

#[derive(Clone, Debug)]
struct ZoneLayout {
    first_lbn: u64,
    first_cylinder: u32,
    cylinders: u32,
    sectors_per_track: u32,
    skew_sectors: u32,
}

#[derive(Clone, Debug)]
pub struct Geometry {
    surfaces: u32,
    band_cylinders: u32,
    zones: Vec<ZoneLayout>,
    total_sectors: u64,
    total_cylinders: u32,
}

impl Geometry {
    /// `switch_fraction` is the track-switch time as a fraction of a revolution; it sets
    /// each zone's skew (rounded up to whole sectors).
    pub fn new(zones: &[Zone], surfaces: u32, band_cylinders: u32, switch_fraction: f64) -> Self {
        assert!(!zones.is_empty(), "a disk needs at least one zone");
        assert!(surfaces > 0 && band_cylinders > 0);
        assert!((0.0..1.0).contains(&switch_fraction));
        let mut layouts = Vec::with_capacity(zones.len());
        let (mut lbn, mut cylinder) = (0u64, 0u32);
        for zone in zones {
            assert!(zone.cylinders > 0 && zone.sectors_per_track > 0);
            let skew = (switch_fraction * f64::from(zone.sectors_per_track)).ceil() as u32;
            layouts.push(ZoneLayout {
                first_lbn: lbn,
                first_cylinder: cylinder,
                cylinders: zone.cylinders,
                sectors_per_track: zone.sectors_per_track,
                skew_sectors: skew % zone.sectors_per_track,
            });
            lbn +=
                u64::from(zone.cylinders) * u64::from(surfaces) * u64::from(zone.sectors_per_track);
            cylinder += zone.cylinders;
        }
        Self {
            surfaces,
            band_cylinders,
            zones: layouts,
            total_sectors: lbn,
            total_cylinders: cylinder,
        }
    }

    pub fn total_sectors(&self) -> u64 {
        self.total_sectors
    }

    pub fn cylinders(&self) -> u32 {
        self.total_cylinders
    }

    pub fn surfaces(&self) -> u32 {
        self.surfaces
    }

    pub fn band_cylinders(&self) -> u32 {
        self.band_cylinders
    }

    fn zone_of_lbn(&self, lbn: u64) -> &ZoneLayout {
        let index = self.zones.partition_point(|z| z.first_lbn <= lbn) - 1;
        &self.zones[index]
    }

    fn zone_of_cylinder(&self, cylinder: u32) -> &ZoneLayout {
        let index = self.zones.partition_point(|z| z.first_cylinder <= cylinder) - 1;
        &self.zones[index]
    }

    /// The physical position of `lbn`. Panics past the end of the disk.
    pub fn locate(&self, lbn: u64) -> Location {
        assert!(
            lbn < self.total_sectors,
            "LBN {lbn} past the end of the disk"
        );
        let zone = self.zone_of_lbn(lbn);
        let spt = u64::from(zone.sectors_per_track);
        let offset = lbn - zone.first_lbn;
        let track = offset / spt; // track index in LBN order within the zone
        let sector = (offset % spt) as u32;
        let band_tracks = u64::from(self.band_cylinders) * u64::from(self.surfaces);
        let band = (track / band_tracks) as u32;
        let within = (track % band_tracks) as u32;
        let band_start = band * self.band_cylinders;
        let band_width = self.band_cylinders.min(zone.cylinders - band_start);
        let skew = (track * u64::from(zone.skew_sectors) % spt) as u32;
        Location {
            cylinder: zone.first_cylinder + band_start + within % band_width,
            head: within / band_width,
            sector,
            slot: (sector + skew) % zone.sectors_per_track,
            sectors_per_track: zone.sectors_per_track,
        }
    }

    /// The LBN at (`cylinder`, `head`, logical `sector` on that track); the inverse of
    /// [`Geometry::locate`].
    pub fn lbn_of(&self, cylinder: u32, head: u32, sector: u32) -> u64 {
        assert!(cylinder < self.total_cylinders && head < self.surfaces);
        let zone = self.zone_of_cylinder(cylinder);
        assert!(sector < zone.sectors_per_track);
        let in_zone = cylinder - zone.first_cylinder;
        let band = in_zone / self.band_cylinders;
        let band_start = band * self.band_cylinders;
        let band_width = self.band_cylinders.min(zone.cylinders - band_start);
        let track = u64::from(band) * u64::from(self.band_cylinders) * u64::from(self.surfaces)
            + u64::from(head) * u64::from(band_width)
            + u64::from(in_zone - band_start);
        zone.first_lbn + track * u64::from(zone.sectors_per_track) + u64::from(sector)
    }

    /// Skew between consecutive tracks of the zone holding `lbn`, in sectors.
    pub fn skew_sectors(&self, lbn: u64) -> u32 {
        self.zone_of_lbn(lbn).skew_sectors
    }
}

/// Zones whose sectors per track fall linearly from `outer_spt` to `inner_spt`, with equal
/// cylinder counts sized so the disk holds at least `capacity_sectors`. Real drives have
/// 15-30 zones with roughly this profile (constant linear density, radius falling inward).
pub fn linear_zones(
    outer_spt: u32,
    inner_spt: u32,
    zone_count: u32,
    surfaces: u32,
    capacity_sectors: u64,
) -> Vec<Zone> {
    assert!(zone_count >= 1 && outer_spt >= inner_spt && inner_spt > 0);
    let spts: Vec<u32> = (0..zone_count)
        .map(|i| {
            if zone_count == 1 {
                return outer_spt;
            }
            let step = f64::from(outer_spt - inner_spt) / f64::from(zone_count - 1);
            outer_spt - (step * f64::from(i)).round() as u32
        })
        .collect();
    let sectors_per_cylinder_set: u64 = spts
        .iter()
        .map(|&s| u64::from(s) * u64::from(surfaces))
        .sum();
    let cylinders = capacity_sectors.div_ceil(sectors_per_cylinder_set) as u32;
    spts.into_iter()
        .map(|sectors_per_track| Zone {
            cylinders,
            sectors_per_track,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Geometry {
        let zones = [
            Zone {
                cylinders: 10,
                sectors_per_track: 20,
            },
            Zone {
                cylinders: 7,
                sectors_per_track: 12,
            },
        ];
        Geometry::new(&zones, 3, 4, 0.15)
    }

    #[test]
    fn serpentine_fills_one_surface_across_the_band_first() {
        let g = small();
        // Track 0..3 of the zone are cylinders 0..3 on head 0; track 4 is head 1, cylinder 0.
        assert_eq!((g.locate(0).cylinder, g.locate(0).head), (0, 0));
        assert_eq!((g.locate(20).cylinder, g.locate(20).head), (1, 0));
        assert_eq!((g.locate(3 * 20).cylinder, g.locate(3 * 20).head), (3, 0));
        assert_eq!((g.locate(4 * 20).cylinder, g.locate(4 * 20).head), (0, 1));
        // After 4 cylinders x 3 heads the next band starts at cylinder 4.
        assert_eq!((g.locate(12 * 20).cylinder, g.locate(12 * 20).head), (4, 0));
    }

    #[test]
    fn a_short_last_band_stays_inside_its_zone() {
        let g = small();
        // Zone 0 has 10 cylinders: bands 0-3, 4-7, 8-9 (2 wide).
        let last_band_first = 2 * 12 * 20;
        assert_eq!(g.locate(last_band_first).cylinder, 8);
        assert_eq!(g.locate(last_band_first + 2 * 20).head, 1);
        let zone1 = 10 * 3 * 20;
        assert_eq!(g.locate(zone1).cylinder, 10);
        assert_eq!(g.locate(zone1).sectors_per_track, 12);
    }

    #[test]
    fn skew_shifts_each_track_by_the_switch_time() {
        let g = small();
        // 0.15 of 20 sectors = 3 sectors of skew.
        assert_eq!(g.locate(20).slot, 3);
        assert_eq!(g.locate(40).slot, 6);
        assert_eq!(g.locate(41).slot, 7);
    }

    #[test]
    fn linear_zones_cover_the_capacity() {
        let zones = linear_zones(1200, 700, 11, 8, 585_937_500);
        let total: u64 = zones
            .iter()
            .map(|z| u64::from(z.cylinders) * 8 * u64::from(z.sectors_per_track))
            .sum();
        assert!(total >= 585_937_500);
        assert!(total < 585_937_500 + 11 * 8 * 1200);
        assert_eq!(zones[0].sectors_per_track, 1200);
        assert_eq!(zones[10].sectors_per_track, 700);
    }
}
