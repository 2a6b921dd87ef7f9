//! Typed configs round-trip: for random valid `[[layer]]` tables of every stateless kind,
//! `config → build → describe().config → config` gives back the same typed config (with the
//! defaults made explicit), and invalid tables are refused with an error naming the field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use strata_backend::MemoryDevice;
use strata_core::layer::{self, LayerArgs, LayerKind, Options, StartPolicy};
use strata_core::{ByteSize, Control, ControlReply, DeviceRef, TokioRuntime};
use strata_stateless::concat::{self, ConcatConfig};
use strata_stateless::crypt::{self, CryptConfig};
use strata_stateless::delay::{self, DelayConfig};
use strata_stateless::fault::{self, FaultConfig};
use strata_stateless::hdd::{self, HddConfig};
use strata_stateless::slice::{self, SliceConfig};
use strata_stateless::stripe::{self, StripeConfig};
use toml::{Table, Value};

/// Per kind (seven kinds): thousands of cases in all, in a few seconds of a debug build.
const CASES: u32 = 250;

/// One random valid layer: its kind, the table a configuration would hold, and its
/// children's sizes.
#[derive(Clone, Debug)]
struct Case {
    kind: &'static LayerKind,
    table: Table,
    children: Vec<u64>,
}

/// `bytes` as a configuration may write it: a number, the canonical text, or in KiB.
fn size_value(bytes: u64) -> impl Strategy<Value = Value> {
    (0..3u8).prop_map(move |form| match form {
        0 => Value::Integer(bytes as i64),
        1 if bytes.is_multiple_of(1024) => Value::String(format!("{} KiB", bytes >> 10)),
        _ => Value::String(ByteSize(bytes).to_string()),
    })
}

/// A case of `kind` whose table holds the options that are `Some` (the rest left to their
/// defaults).
fn case<const N: usize>(
    kind: &'static LayerKind,
    children: Vec<u64>,
    options: [(&str, Option<Value>); N],
) -> Case {
    let table = options
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_string(), value?)))
        .collect();
    Case {
        kind,
        table,
        children,
    }
}

fn sector_aligned_child() -> impl Strategy<Value = u64> {
    (1u64..=64).prop_map(|k| k * (64 << 10))
}

fn slice_case() -> impl Strategy<Value = Case> {
    sector_aligned_child()
        .prop_flat_map(|child| {
            let sectors = child / 512;
            (Just(child), 0..sectors).prop_flat_map(move |(child, start)| {
                (Just(child), Just(start), 1..=sectors - start)
            })
        })
        .prop_flat_map(|(child, start, len)| {
            (
                Just(child),
                proptest::option::of(size_value(start * 512)),
                proptest::option::of(size_value(len * 512)),
            )
        })
        .prop_map(|(child, offset, length)| {
            case(
                &slice::KIND,
                vec![child],
                [("offset", offset), ("length", length)],
            )
        })
}

fn concat_case() -> impl Strategy<Value = Case> {
    proptest::collection::vec(sector_aligned_child(), 1..5).prop_map(|children| Case {
        kind: &concat::KIND,
        table: Table::new(),
        children,
    })
}

fn stripe_case() -> impl Strategy<Value = Case> {
    (12u32..=20, 2usize..6)
        .prop_flat_map(|(chunk_bits, n)| {
            let chunk = 1u64 << chunk_bits;
            (
                proptest::option::of(size_value(chunk)),
                // At least one chunk of the largest (1 MiB) on every child, whatever the
                // default is when the chunk is left out.
                proptest::collection::vec((1u64..=4).prop_map(|k| (k << 20) + 4096), n),
            )
        })
        .prop_map(|(chunk, children)| case(&stripe::KIND, children, [("chunk", chunk)]))
}

fn crypt_case() -> impl Strategy<Value = Case> {
    (
        proptest::option::of(prop_oneof![Just(512u64), Just(4096)].prop_flat_map(size_value)),
        sector_aligned_child(),
    )
        .prop_map(|(sector, child)| {
            case(
                &crypt::KIND,
                vec![child],
                [
                    ("key-file", Some(Value::String(KEY_FILE.into()))),
                    ("sector-size", sector),
                ],
            )
        })
}

fn duration_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::String("0".into())),
        (
            1u64..5000,
            prop_oneof![Just("ns"), Just("us"), Just("µs"), Just("ms"), Just("s")]
        )
            .prop_map(|(n, unit)| {
                // Whole hours at most, as the parser allows.
                let n = if unit == "s" { n % 3600 + 1 } else { n };
                Value::String(format!("{n}{unit}"))
            }),
        (1u32..1000).prop_map(|tenths| Value::String(format!("{}.{}ms", tenths / 10, tenths % 10))),
    ]
}

fn delay_case() -> impl Strategy<Value = Case> {
    let bandwidth = (1u64..=1 << 20).prop_flat_map(|kib| {
        let bytes = kib << 10;
        prop_oneof![
            size_value(bytes),
            Just(Value::String(format!("{}/s", ByteSize(bytes)))),
        ]
    });
    (
        proptest::option::of(duration_value()),
        proptest::option::of(duration_value()),
        proptest::option::of(bandwidth),
        proptest::option::of(prop_oneof![
            Just(Value::String("9ms".into())),
            Just(Value::String("17ms".into())),
            Just(Value::String("25ms".into())),
        ]),
        proptest::option::of((0i64..1000).prop_map(Value::Integer)),
        sector_aligned_child(),
    )
        .prop_map(|(read, write, bandwidth, rtt, seed, child)| {
            case(
                &delay::KIND,
                vec![child],
                [
                    ("read-latency", read),
                    ("write-latency", write),
                    ("bandwidth", bandwidth),
                    ("rtt", rtt),
                    ("seed", seed),
                ],
            )
        })
}

fn ranges_value() -> impl Strategy<Value = Value> {
    let range = (0u64..1 << 30, 1u64..1 << 20).prop_flat_map(|(offset, len)| {
        (0..2u8).prop_map(move |form| match form {
            0 => format!("{offset}+{len}"),
            _ => format!("{}+{}", ByteSize(offset), ByteSize(len)),
        })
    });
    proptest::collection::vec(range, 0..4).prop_map(|parts| Value::String(parts.join(",")))
}

fn fault_case() -> impl Strategy<Value = Case> {
    (
        proptest::option::of(ranges_value()),
        proptest::option::of(ranges_value()),
        proptest::option::of(prop_oneof![
            (0.0f64..=1.0).prop_map(Value::Float),
            (0i64..=1).prop_map(Value::Integer),
        ]),
        proptest::option::of((0..=i64::MAX).prop_map(Value::Integer)),
        sector_aligned_child(),
    )
        .prop_map(|(fail_read, fail_write, rate, seed, child)| {
            case(
                &fault::KIND,
                vec![child],
                [
                    ("fail-read", fail_read),
                    ("fail-write", fail_write),
                    ("error-rate", rate),
                    ("seed", seed),
                ],
            )
        })
}

fn hdd_case() -> impl Strategy<Value = Case> {
    let model = prop_oneof![
        Just("wd-re3-1t"),
        Just("wd-re3-1t-order-quirk"),
        Just("cheetah-15k5-300g"),
        Just("fc-10k-146g"),
    ];
    (
        model,
        proptest::option::of((1i64..=64).prop_map(Value::Integer)),
        proptest::option::of(prop_oneof![Just("sptf"), Just("fifo")]),
        proptest::option::of((0..=i64::MAX).prop_map(Value::Integer)),
        sector_aligned_child(),
    )
        .prop_map(|(model, depth, scheduler, seed, child)| {
            case(
                &hdd::KIND,
                vec![child],
                [
                    ("model", Some(Value::String(model.into()))),
                    ("queue-depth", depth),
                    ("scheduler", scheduler.map(|s| Value::String(s.into()))),
                    ("seed", seed),
                ],
            )
        })
}

fn any_case() -> impl Strategy<Value = Case> {
    prop_oneof![
        slice_case(),
        concat_case(),
        stripe_case(),
        crypt_case(),
        delay_case(),
        fault_case(),
        hdd_case(),
    ]
}

const KEY_FILE: &str = "keys/round-trip.key";

/// A configuration folder with a key file at [`KEY_FILE`], relative to it.
fn config_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-config-roundtrip-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("keys")).unwrap();
    let key: Vec<u8> = (0..crypt::KEY_BYTES as u8).collect();
    std::fs::write(dir.join(KEY_FILE), key).unwrap();
    dir
}

fn options(table: &Table, base: &Path) -> Options {
    layer::options_from_table(table, base.to_path_buf()).unwrap()
}

/// Builds `case` on memory devices and returns what `describe` says its config is.
async fn build_and_describe(case: &Case, base: &Path) -> Table {
    let children: Vec<Option<DeviceRef>> = case
        .children
        .iter()
        .map(|&size| Some(Arc::new(MemoryDevice::new(size)) as DeviceRef))
        .collect();
    let args = LayerArgs {
        name: "under-test".into(),
        child_names: (0..children.len()).map(|i| format!("d{i}")).collect(),
        children,
        options: options(&case.table, base),
        runtime: TokioRuntime::current(),
        start: StartPolicy::FRESH,
    };
    let device = (case.kind.build)(args)
        .await
        .unwrap_or_else(|e| panic!("{} {:?} does not build: {e}", case.kind.kind, case.table));
    let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
        panic!("no description");
    };
    assert_eq!(node.kind, case.kind.kind);
    node.config
        .expect("a layer built from a config describes its config")
}

/// The typed config `T` the table gives, and the one `described` gives back.
fn both<T: DeserializeOwned>(case: &Case, described: &Table, base: &Path) -> (T, T) {
    let given = options(&case.table, base).parse::<T>().unwrap();
    let back = options(described, base)
        .parse::<T>()
        .unwrap_or_else(|e| panic!("described config {described:?} does not parse: {e}"));
    (given, back)
}

/// The table and its description give the same `T` (whose defaults are explicit values).
fn same<T: DeserializeOwned + PartialEq + std::fmt::Debug>(
    case: &Case,
    described: &Table,
    base: &Path,
) {
    let (given, back) = both::<T>(case, described, base);
    assert_eq!(given, back);
}

/// What describe must return for `case`: the given config with its defaults explicit.
fn check_round_trip(case: &Case, described: &Table, base: &Path) {
    match case.kind.kind {
        "slice" => {
            let (mut given, back) = both::<SliceConfig>(case, described, base);
            given.length = given
                .length
                .or(Some(ByteSize(case.children[0] - given.offset.0)));
            assert_eq!(given, back);
        }
        "concat" => same::<ConcatConfig>(case, described, base),
        "stripe" => same::<StripeConfig>(case, described, base),
        "crypt" => {
            let (given, back) = both::<CryptConfig>(case, described, base);
            assert_eq!(back.key_file, Path::new(KEY_FILE), "kept relative");
            assert_eq!(given, back);
        }
        "delay" => same::<DelayConfig>(case, described, base),
        "fault" => same::<FaultConfig>(case, described, base),
        "hdd" => {
            // The preset's queue depth and scheduler come back explicit.
            let (given, back) = both::<HddConfig>(case, described, base);
            assert_eq!(given.explicit().unwrap(), back);
        }
        other => panic!("no round trip written for {other}"),
    }
    // Every option is explicit in the description, except those whose absence means
    // something no value can say (a slice's length is always explicit; delay's bandwidth
    // absent is "unlimited", its rtt absent "no round trip").
    for field in (case.kind.options)() {
        assert!(
            described.contains_key(*field) || *field == "bandwidth" || *field == "rtt",
            "{} describes no {field}: {described:?}",
            case.kind.kind
        );
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES * 7))]

    #[test]
    fn config_build_describe_config_is_the_identity(case in any_case()) {
        let base = config_dir();
        let described = runtime().block_on(build_and_describe(&case, &base));
        check_round_trip(&case, &described, &base);
        // And the description builds again, to the same description.
        let again = Case { table: described.clone(), ..case.clone() };
        let twice = runtime().block_on(build_and_describe(&again, &base));
        prop_assert_eq!(twice, described);
    }

    #[test]
    fn invalid_tables_are_refused_naming_the_field(
        case in any_case(),
        bad in 0..3u8,
        junk in "[a-z]{1,8}",
    ) {
        let known = (case.kind.options)();
        let mut table = case.table.clone();
        let field = match bad {
            // An unknown option.
            0 => {
                let field = format!("no-{junk}");
                table.insert(field.clone(), Value::Integer(1));
                field
            }
            // A value of the wrong type (a table-less kind has nothing to get wrong).
            1 if !known.is_empty() => {
                let field = known[junk.len() % known.len()].to_string();
                table.insert(field.clone(), Value::Boolean(true));
                field
            }
            // A size, duration or range list that does not parse.
            _ if !known.is_empty() => {
                let field = known[junk.len() % known.len()].to_string();
                table.insert(field.clone(), Value::String(format!("{junk}?")));
                field
            }
            _ => {
                table.insert("chunk".into(), Value::String("64KiB".into()));
                "chunk".into()
            }
        };
        if case.kind.kind == "crypt" && field == "key-file" {
            // Any text is a path; a bad one fails at build, naming the file.
            return Ok(());
        }
        let error = (case.kind.check)(&options(&table, Path::new("")))
            .expect_err("an invalid table must be refused")
            .to_string();
        prop_assert!(error.contains(&format!("field `{field}`")), "{}: {}", case.kind.kind, error);
    }
}

#[test]
fn a_missing_key_file_is_named() {
    let error = (crypt::KIND.check)(&options(&Table::new(), Path::new("")))
        .unwrap_err()
        .to_string();
    assert!(error.contains("field `key-file` is required"), "{error}");
}
