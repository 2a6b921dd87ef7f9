//! Block-trace readers: MQSim ASCII, MSR-Cambridge CSV and SPC CSV, into one record type in
//! bytes and nanoseconds. Errors name the line (1-based) and the field. Blank lines and lines
//! starting with `#` are skipped in every format.

use std::io::BufRead;
use std::path::Path;

use crate::model::{Nanos, Op};

const SECTOR_BYTES: u64 = 512;

/// One request of a trace, as recorded: absolute timestamp, the trace's own device number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    pub timestamp_ns: Nanos,
    /// MQSim device number, MSR DiskNumber or SPC ASU.
    pub device: u32,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// `arrival_ns device lba_512 size_512 type` (type 0 = write, 1 = read), space separated.
    Mqsim,
    /// `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`; timestamp in Windows
    /// filetime (100 ns units), type `Read`/`Write`, offset and size in bytes.
    MsrCsv,
    /// `ASU,LBA,Size,Opcode,Timestamp[,...]`; LBA in 512 B blocks, size in bytes, opcode
    /// `r`/`w`, timestamp in seconds. Fields after the fifth are ignored (the SPC format allows
    /// optional ones).
    SpcCsv,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: expected {expected} fields, found {found}")]
    FieldCount {
        line: usize,
        expected: &'static str,
        found: usize,
    },
    #[error("line {line}: field {field}: {problem}")]
    Field {
        line: usize,
        field: &'static str,
        problem: String,
    },
}

impl TraceError {
    /// The 1-based line of a parse error (`None` for an I/O error).
    pub fn line(&self) -> Option<usize> {
        match self {
            TraceError::Io { .. } => None,
            TraceError::FieldCount { line, .. } | TraceError::Field { line, .. } => Some(*line),
        }
    }
}

/// Reads a whole trace file.
pub fn read_trace(path: &Path, format: TraceFormat) -> Result<Vec<TraceRecord>, TraceError> {
    let io_error = |source| TraceError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    parse_trace(std::io::BufReader::new(file), format).map_err(|error| match error {
        TraceError::Io { source, .. } => io_error(source),
        other => other,
    })
}

pub fn parse_trace(
    reader: impl BufRead,
    format: TraceFormat,
) -> Result<Vec<TraceRecord>, TraceError> {
    let mut records = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| TraceError::Io {
            path: String::new(),
            source,
        })?;
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let number = index + 1;
        let record = match format {
            TraceFormat::Mqsim => parse_mqsim_line(number, text)?,
            TraceFormat::MsrCsv => parse_msr_line(number, text)?,
            TraceFormat::SpcCsv => parse_spc_line(number, text)?,
        };
        records.push(record);
    }
    Ok(records)
}

fn parse_mqsim_line(line: usize, text: &str) -> Result<TraceRecord, TraceError> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(TraceError::FieldCount {
            line,
            expected: "5",
            found: fields.len(),
        });
    }
    let op = match uint(line, "type", fields[4])? {
        0 => Op::Write,
        1 => Op::Read,
        other => {
            return Err(problem(
                line,
                "type",
                format!("{other} is neither 0 (write) nor 1 (read)"),
            ))
        }
    };
    Ok(TraceRecord {
        timestamp_ns: uint(line, "arrival_time_ns", fields[0])?,
        device: device(line, "device_number", fields[1])?,
        op,
        offset: sectors_to_bytes(line, "start_lba", uint(line, "start_lba", fields[2])?)?,
        len: sectors_to_bytes(line, "size_sectors", uint(line, "size_sectors", fields[3])?)?,
    })
}

fn parse_msr_line(line: usize, text: &str) -> Result<TraceRecord, TraceError> {
    let fields: Vec<&str> = text.split(',').map(str::trim).collect();
    if fields.len() != 7 {
        return Err(TraceError::FieldCount {
            line,
            expected: "7",
            found: fields.len(),
        });
    }
    let filetime = uint(line, "Timestamp", fields[0])?;
    let op = match fields[3].to_ascii_lowercase().as_str() {
        "read" => Op::Read,
        "write" => Op::Write,
        _ => {
            return Err(problem(
                line,
                "Type",
                format!("`{}` is neither Read nor Write", fields[3]),
            ))
        }
    };
    uint(line, "ResponseTime", fields[6])?;
    Ok(TraceRecord {
        timestamp_ns: filetime
            .checked_mul(100)
            .ok_or_else(|| problem(line, "Timestamp", "overflows u64 nanoseconds".into()))?,
        device: device(line, "DiskNumber", fields[2])?,
        op,
        offset: uint(line, "Offset", fields[4])?,
        len: uint(line, "Size", fields[5])?,
    })
}

fn parse_spc_line(line: usize, text: &str) -> Result<TraceRecord, TraceError> {
    let fields: Vec<&str> = text.split(',').map(str::trim).collect();
    if fields.len() < 5 {
        return Err(TraceError::FieldCount {
            line,
            expected: "at least 5",
            found: fields.len(),
        });
    }
    let op = match fields[3] {
        "r" | "R" => Op::Read,
        "w" | "W" => Op::Write,
        other => {
            return Err(problem(
                line,
                "Opcode",
                format!("`{other}` is neither r nor w"),
            ))
        }
    };
    let seconds: f64 = fields[4].parse().map_err(|_| {
        problem(
            line,
            "Timestamp",
            format!("`{}` is not a number", fields[4]),
        )
    })?;
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(problem(
            line,
            "Timestamp",
            format!("{seconds} is not a time"),
        ));
    }
    Ok(TraceRecord {
        timestamp_ns: (seconds * 1e9).round() as Nanos,
        device: device(line, "ASU", fields[0])?,
        op,
        offset: sectors_to_bytes(line, "LBA", uint(line, "LBA", fields[1])?)?,
        len: uint(line, "Size", fields[2])?,
    })
}

fn problem(line: usize, field: &'static str, problem: String) -> TraceError {
    TraceError::Field {
        line,
        field,
        problem,
    }
}

fn uint(line: usize, field: &'static str, text: &str) -> Result<u64, TraceError> {
    text.parse()
        .map_err(|_| problem(line, field, format!("`{text}` is not an unsigned integer")))
}

fn device(line: usize, field: &'static str, text: &str) -> Result<u32, TraceError> {
    text.parse()
        .map_err(|_| problem(line, field, format!("`{text}` is not a device number")))
}

fn sectors_to_bytes(line: usize, field: &'static str, sectors: u64) -> Result<u64, TraceError> {
    sectors
        .checked_mul(SECTOR_BYTES)
        .ok_or_else(|| problem(line, field, format!("{sectors} sectors overflow u64 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, format: TraceFormat) -> Result<Vec<TraceRecord>, TraceError> {
        parse_trace(text.as_bytes(), format)
    }

    #[test]
    fn mqsim_line_in_bytes() {
        let records = parse("11413000 0 657728 16 1\n\n5 3 1 1 0\n", TraceFormat::Mqsim).unwrap();
        assert_eq!(
            records[0],
            TraceRecord {
                timestamp_ns: 11_413_000,
                device: 0,
                op: Op::Read,
                offset: 657_728 * 512,
                len: 8192
            }
        );
        assert_eq!(records[1].op, Op::Write);
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn errors_name_line_and_field() {
        let error = parse("1 0 0 8 1\n# comment\n1 0 x 8 1\n", TraceFormat::Mqsim).unwrap_err();
        assert_eq!(error.line(), Some(3));
        assert_eq!(
            error.to_string(),
            "line 3: field start_lba: `x` is not an unsigned integer"
        );
        let error = parse("1 0 0 8 2\n", TraceFormat::Mqsim).unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 1: field type: 2 is neither 0 (write) nor 1 (read)"
        );
        let error = parse("1 0 0 8\n", TraceFormat::Mqsim).unwrap_err();
        assert_eq!(error.to_string(), "line 1: expected 5 fields, found 4");
    }

    #[test]
    fn msr_and_spc_fields() {
        let msr = "128166372003061629,web,1,Write,7014609920,24576,41286\n";
        let record = parse(msr, TraceFormat::MsrCsv).unwrap()[0];
        assert_eq!(record.timestamp_ns, 12_816_637_200_306_162_900);
        assert_eq!(
            (record.device, record.op, record.offset, record.len),
            (1, Op::Write, 7_014_609_920, 24_576)
        );
        let spc = "0,20941264,8192,W,0.551706,extra\n";
        let record = parse(spc, TraceFormat::SpcCsv).unwrap()[0];
        assert_eq!(record.timestamp_ns, 551_706_000);
        assert_eq!(
            (record.device, record.op, record.offset, record.len),
            (0, Op::Write, 20_941_264 * 512, 8192)
        );
        let error = parse("0,1,512,x,0.1\n", TraceFormat::SpcCsv).unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 1: field Opcode: `x` is neither r nor w"
        );
    }
}
