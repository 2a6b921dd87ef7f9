//! The thin pool's on-disk decoders fed random and mutated bytes inside the normal test
//! suite (the cargo fuzz targets `thin_records` and `thin_delta` run the same entry points
//! longer, see docs/fuzzing.md): each refuses or round-trips, never panics.

use proptest::prelude::*;
use strata_thin::fuzzing;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn records_refuse_or_round_trip(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        fuzzing::records(&data);
    }

    #[test]
    fn delta_records_refuse_or_decode_whole(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        fuzzing::delta_record(&data);
    }

    /// Valid records with bytes flipped reach deeper than random bytes do.
    #[test]
    fn flipped_delta_records_refuse_or_decode_whole(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        use strata_thin::delta::{encode, TakenLink};
        use strata_thin::versions::Granules;
        let base: Vec<u8> = (0..16 * 4096u64).map(|i| (i % 251) as u8).collect();
        let links = vec![TakenLink {
            epoch: 3,
            data: Granules::from_fn(16, |g| g == 2 || g == 5),
            zeros: Granules::from_fn(16, |g| g == 7),
        }];
        let mut data = base[2 * 4096..3 * 4096].to_vec();
        data.extend_from_slice(&base[5 * 4096..6 * 4096]);
        data[17] ^= 0x55;
        let mut record = encode(&links, &data, &base).unwrap();
        for (at, byte) in flips {
            let at = at % record.len();
            record[at] ^= byte | 1;
        }
        fuzzing::delta_record(&record);
    }
}
