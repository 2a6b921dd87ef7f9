//! Typed configs round-trip for mirror and raid5: for random valid `[[layer]]` tables over
//! blank in-memory members, `config → build → describe().config → config` gives back the
//! same typed config with the defaults made explicit (what the array records), the
//! description builds the same layer again, and invalid tables are refused naming the field.

use std::path::PathBuf;
use std::sync::Arc;

use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::layer::{self, LayerArgs, LayerKind, Options, StartPolicy};
use strata_core::{ByteSize, Control, ControlReply, DeviceRef, TokioRuntime};
use strata_raid::mirror::{self, MirrorConfig};
use strata_raid::raid5::{self, default_journal, journal::device_bytes, Raid5Config};
use toml::{Table, Value};

/// Per kind; each case formats and opens its layer twice on sparse in-memory members.
const CASES: u32 = 750;

/// A random valid table of `kind`, over members of these sizes (the last named `nv` when
/// it is a raid5's journal device).
#[derive(Clone, Debug)]
struct Stack {
    kind: &'static LayerKind,
    table: Table,
    members: Vec<u64>,
}

/// A size as a configuration may write it: bytes or canonical text.
fn written(bytes: u64, as_text: bool) -> Value {
    if as_text {
        Value::String(ByteSize(bytes).to_string())
    } else {
        Value::Integer(bytes as i64)
    }
}

fn table_of(entries: Vec<(&str, Option<Value>)>) -> Table {
    entries
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_string(), value?)))
        .collect()
}

fn mirror_stack() -> impl Strategy<Value = Stack> {
    (
        2usize..=4,
        proptest::option::of((16u32..=26).prop_map(|bits| 1u64 << bits)),
        proptest::option::of((1u64..=8).prop_map(|mib| mib << 20)),
        proptest::option::of(0u64..=600_000),
        proptest::option::of(0u64..=64),
        any::<bool>(),
    )
        .prop_map(|(n, region, metadata, clear, concurrency, as_text)| Stack {
            kind: &mirror::KIND,
            table: table_of(vec![
                ("region", region.map(|r| written(r, as_text))),
                ("metadata-size", metadata.map(|m| written(m, as_text))),
                ("bitmap-clear-ms", clear.map(|c| Value::Integer(c as i64))),
                (
                    "resync-concurrency",
                    concurrency.map(|c| Value::Integer(c as i64)),
                ),
            ]),
            members: vec![64 << 20; n],
        })
}

fn raid5_stack() -> impl Strategy<Value = Stack> {
    (
        3usize..=5,
        proptest::option::of((12u32..=16).prop_map(|bits| 1u64 << bits)),
        proptest::option::of(0u64..64),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(n, chunk, extra_blocks, journal_device, as_text)| {
            let least = default_journal(n, chunk.unwrap_or(raid5::DEFAULT_CHUNK));
            let journal = extra_blocks.map(|k| least + k * 4096);
            let mut members = vec![32 << 20; n];
            if journal_device {
                members.push(device_bytes(n, journal.unwrap_or(least)));
            }
            Stack {
                kind: &raid5::KIND,
                table: table_of(vec![
                    ("chunk", chunk.map(|c| written(c, as_text))),
                    ("journal", journal.map(|j| written(j, as_text))),
                    (
                        "journal-device",
                        journal_device.then(|| Value::String("nv".into())),
                    ),
                ]),
                members,
            }
        })
}

fn options(table: &Table) -> Options {
    layer::options_from_table(table, PathBuf::new()).unwrap()
}

fn member_names(stack: &Stack) -> Vec<String> {
    let n = stack.members.len();
    let journal_device = stack.table.contains_key("journal-device");
    (0..n)
        .map(|i| match i + 1 == n && journal_device {
            true => "nv".to_string(),
            false => format!("d{i}"),
        })
        .collect()
}

/// Builds `table` as `stack`'s kind on blank members and returns its described config.
fn build_and_describe(stack: &Stack, table: &Table) -> Result<Table, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let args = LayerArgs {
            name: "under-test".into(),
            children: stack
                .members
                .iter()
                .map(|&size| Some(Arc::new(MemoryDevice::new(size)) as DeviceRef))
                .collect(),
            child_names: member_names(stack),
            options: options(table),
            runtime: TokioRuntime::current(),
            start: StartPolicy::FRESH,
        };
        let device = (stack.kind.build)(args).await.map_err(|e| e.to_string())?;
        let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
            panic!("no description");
        };
        Ok(node
            .config
            .expect("a layer built from a config describes it"))
    })
}

/// `stack`'s table with its defaults made explicit, and the description, both typed.
fn check_round_trip(stack: &Stack, described: &Table) {
    let given = options(&stack.table);
    let back = options(described);
    if stack.kind.kind == "mirror" {
        let given: MirrorConfig = given.parse().unwrap();
        assert_eq!(back.parse::<MirrorConfig>().unwrap(), given);
    } else {
        let mut given: Raid5Config = given.parse().unwrap();
        let data_members = stack.members.len() - usize::from(given.journal_device.is_some());
        let chunk = given.chunk.get_or_insert(ByteSize(raid5::DEFAULT_CHUNK)).0;
        given
            .journal
            .get_or_insert(ByteSize(default_journal(data_members, chunk)));
        assert_eq!(back.parse::<Raid5Config>().unwrap(), given);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES * 2))]

    #[test]
    fn config_build_describe_config_is_the_identity(
        stack in prop_oneof![mirror_stack(), raid5_stack()]
    ) {
        let described = build_and_describe(&stack, &stack.table)
            .unwrap_or_else(|e| panic!("{stack:?} does not build: {e}"));
        check_round_trip(&stack, &described);
        prop_assert_eq!(build_and_describe(&stack, &described), Ok(described));
    }

    #[test]
    fn invalid_tables_are_refused_naming_the_field(
        stack in prop_oneof![mirror_stack(), raid5_stack()],
        pick in any::<prop::sample::Index>(),
        bad in 0..3u8,
    ) {
        let known = (stack.kind.options)();
        let field = pick.get(known).to_string();
        let mut table = stack.table.clone();
        let (field, value) = match bad {
            0 => (format!("{field}s"), Value::Integer(1)),
            1 => (field, Value::Boolean(true)),
            // Text where a number is wanted, or a size that does not parse; any text names
            // a journal device, checked against the children at build.
            _ if field == "journal-device" => (field, Value::Float(1.5)),
            _ => (field, Value::String("12 parsecs".into())),
        };
        table.insert(field.clone(), value);
        let error = (stack.kind.check)(&options(&table))
            .expect_err("an invalid table must be refused")
            .to_string();
        prop_assert!(error.contains(&format!("field `{field}`")), "{:?}: {}", stack, error);
    }
}

#[test]
fn a_journal_device_that_is_not_a_child_is_named() {
    let stack = Stack {
        kind: &raid5::KIND,
        table: table_of(vec![("journal-device", Some(Value::String("nv9".into())))]),
        members: vec![32 << 20; 3],
    };
    let error = build_and_describe(&stack, &stack.table).unwrap_err();
    assert!(error.contains("journal-device = \"nv9\""), "{error}");
}
