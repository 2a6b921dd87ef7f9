//! One error type for every block device, with one exhaustive mapping to the errno values
//! the NBD protocol carries on the wire.

use std::io;

/// The result of every block operation.
pub type Result<T> = std::result::Result<T, BlockError>;

/// Why a block operation failed. Each variant maps to exactly one errno (see [`BlockError::errno`]),
/// so the kind of failure survives every layer up to the client.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The request is malformed for this device: misaligned, zero where not allowed, bad flags.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The request reaches past the end of the device.
    #[error("request [{offset}, +{len}) reaches past the end of the device ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// The request is larger than the device accepts in one piece.
    #[error("request of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge { len: u64, max: u64 },
    /// The device (or the pool behind it) has no space left for this write.
    #[error("no space left on device")]
    NoSpace,
    /// The device is read-only.
    #[error("device is read-only")]
    ReadOnly,
    /// The device does not implement this operation, or cannot do it fast (FAST_ZERO).
    #[error("operation not supported: {0}")]
    Unsupported(&'static str),
    /// The device is shutting down and accepts no new work.
    #[error("device is shutting down")]
    Shutdown,
    /// Stored structures are damaged: metadata that fails its checksum or its checks, a
    /// journal that cannot be replayed. Not the request's fault, and retrying will not help.
    #[error("damaged: {0}")]
    Corrupt(String),
    /// A lock inside the device was poisoned by a panic: the device's in-memory state may be
    /// half-updated, so it refuses the request rather than serve from it.
    #[error("device {device} is broken: a task panicked while it held {what}; restart to recover")]
    Poisoned { device: String, what: &'static str },
    /// The medium failed. The source keeps the OS error for the log.
    #[error("I/O error: {context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl BlockError {
    /// The same kind of failure told again with new `context`, for a device that remembers a
    /// failure and refuses later calls with it (a full device stays ENOSPC, not EIO). An OS
    /// error keeps its code; a kind without a message keeps the kind alone.
    pub fn recur(&self, context: impl Into<String>) -> BlockError {
        let context = context.into();
        match self {
            BlockError::InvalidArgument(_) => BlockError::InvalidArgument(context),
            BlockError::OutOfRange { offset, len, size } => BlockError::OutOfRange {
                offset: *offset,
                len: *len,
                size: *size,
            },
            BlockError::TooLarge { len, max } => BlockError::TooLarge {
                len: *len,
                max: *max,
            },
            BlockError::NoSpace => BlockError::NoSpace,
            BlockError::ReadOnly => BlockError::ReadOnly,
            BlockError::Unsupported(what) => BlockError::Unsupported(what),
            BlockError::Shutdown => BlockError::Shutdown,
            BlockError::Corrupt(_) => BlockError::Corrupt(context),
            BlockError::Poisoned { device, what } => BlockError::Poisoned {
                device: device.clone(),
                what,
            },
            BlockError::Io { source, .. } => {
                let source = match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                };
                BlockError::Io { context, source }
            }
        }
    }

    /// The same failure, with the same message, for another caller that waited on the one
    /// operation that failed (writes carried by one shared update, say).
    pub fn again(&self) -> BlockError {
        match self {
            BlockError::InvalidArgument(context)
            | BlockError::Corrupt(context)
            | BlockError::Io { context, .. } => self.recur(context.clone()),
            _ => self.recur(String::new()),
        }
    }

    /// Wraps an OS error with what we were doing when it happened.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        BlockError::Io {
            context: context.into(),
            source,
        }
    }

    /// The Linux errno value for this error, as the NBD protocol defines them.
    pub fn errno(&self) -> u32 {
        match self {
            BlockError::InvalidArgument(_) => errno::EINVAL,
            BlockError::OutOfRange { .. } => errno::EINVAL,
            BlockError::TooLarge { .. } => errno::EOVERFLOW,
            BlockError::NoSpace => errno::ENOSPC,
            BlockError::ReadOnly => errno::EPERM,
            BlockError::Unsupported(_) => errno::ENOTSUP,
            BlockError::Shutdown => errno::ESHUTDOWN,
            // The NBD protocol has no errno for damaged data (no EBADMSG or EUCLEAN on the
            // wire); EIO is what a disk answers for an unreadable sector, and what clients
            // treat as "this data cannot be had".
            BlockError::Corrupt(_) => errno::EIO,
            BlockError::Poisoned { .. } => errno::EIO,
            BlockError::Io { source, .. } => match source.raw_os_error() {
                Some(code) if code == errno::ENOSPC as i32 => errno::ENOSPC,
                Some(code) if code == errno::EDQUOT => errno::ENOSPC,
                Some(code) if code == errno::EOPNOTSUPP as i32 => errno::ENOTSUP,
                _ => errno::EIO,
            },
        }
    }
}

/// The errno values the NBD protocol allows on the wire (doc/proto.md, "Error values").
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const EOPNOTSUPP: u32 = 95;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
    /// Disk quota exceeded; reported to clients as ENOSPC.
    pub const EDQUOT: i32 = 122;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_keeps_its_errno() {
        assert_eq!(BlockError::InvalidArgument("x".into()).errno(), 22);
        assert_eq!(
            BlockError::OutOfRange {
                offset: 1,
                len: 2,
                size: 2
            }
            .errno(),
            22
        );
        assert_eq!(BlockError::TooLarge { len: 9, max: 8 }.errno(), 75);
        assert_eq!(BlockError::NoSpace.errno(), 28);
        assert_eq!(BlockError::ReadOnly.errno(), 1);
        assert_eq!(BlockError::Unsupported("x").errno(), 95);
        assert_eq!(BlockError::Shutdown.errno(), 108);
        assert_eq!(BlockError::Corrupt("x".into()).errno(), 5);
        let poisoned = BlockError::Poisoned {
            device: "m0".into(),
            what: "the member table",
        };
        assert_eq!(poisoned.errno(), 5);
        assert!(poisoned.to_string().contains("m0"));
    }

    #[test]
    fn a_recurring_failure_keeps_its_kind_and_takes_the_new_context() {
        let full = BlockError::io("write", io::Error::from_raw_os_error(28));
        let again = full.recur("store failed earlier");
        assert_eq!(again.errno(), errno::ENOSPC);
        assert!(again.to_string().contains("store failed earlier"));
        assert!(matches!(
            BlockError::NoSpace.recur("x"),
            BlockError::NoSpace
        ));
        let damaged = BlockError::Corrupt("old".into()).recur("new");
        assert!(matches!(&damaged, BlockError::Corrupt(m) if m == "new"));
        let other = BlockError::io("read", io::Error::other("boom")).recur("later");
        assert_eq!(other.errno(), errno::EIO);
        assert!(matches!(
            BlockError::ReadOnly.recur("x").errno(),
            errno::EPERM
        ));
    }

    #[test]
    fn a_failure_told_again_reads_and_maps_the_same() {
        let failures = [
            BlockError::io(
                "raid5 r: stripe 3 write did not settle",
                io::Error::other("x"),
            ),
            BlockError::io("write", io::Error::from_raw_os_error(28)),
            BlockError::Corrupt("journal".into()),
            BlockError::InvalidArgument("misaligned".into()),
            BlockError::NoSpace,
            BlockError::Shutdown,
        ];
        for failure in failures {
            let again = failure.again();
            assert_eq!(again.to_string(), failure.to_string());
            assert_eq!(again.errno(), failure.errno());
        }
    }

    #[test]
    fn os_errors_map_by_kind_not_to_eio_blindly() {
        let full = BlockError::io("write", io::Error::from_raw_os_error(28));
        assert_eq!(full.errno(), errno::ENOSPC);
        let quota = BlockError::io("write", io::Error::from_raw_os_error(122));
        assert_eq!(quota.errno(), errno::ENOSPC);
        let medium = BlockError::io("read", io::Error::from_raw_os_error(5));
        assert_eq!(medium.errno(), errno::EIO);
        let other = BlockError::io("read", io::Error::other("boom"));
        assert_eq!(other.errno(), errno::EIO);
    }
}
