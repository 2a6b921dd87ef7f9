//! Opening a file or block device and learning its size, block sizes and O_DIRECT alignment.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Seek};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::{AtFlags, OFlags, StatxFlags};
use strata_core::{BlockError, Geometry, Result};

use super::syncs::{Syncs, DESCRIPTIONS};
use super::sys::{Backing, Kind};
use super::FileOptions;

/// A freshly opened backing and what the device reports about it.
pub(super) struct Opened {
    pub(super) backing: Backing,
    pub(super) geometry: Geometry,
    pub(super) rotational: bool,
}

/// O_DIRECT's demands: offsets and lengths, and buffer addresses.
#[derive(Clone, Copy)]
struct DirectAlign {
    offset: u32,
    memory: usize,
}

pub(super) fn open(options: &FileOptions) -> Result<Opened> {
    let path = options.path.as_path();
    let context = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |e| BlockError::io(what, e)
    };
    let (file, created) = open_file(options).map_err(context("open"))?;
    let meta = file.metadata().map_err(context("stat"))?;
    let kind = if meta.is_file() {
        Kind::Regular
    } else if meta.file_type().is_block_device() {
        Kind::BlockDevice
    } else {
        return Err(BlockError::InvalidArgument(format!(
            "{} is neither a regular file nor a block device",
            path.display()
        )));
    };

    let size = match kind {
        Kind::Regular => regular_size(&file, options, meta.len())?,
        Kind::BlockDevice => block_device_size(&file, options)?,
    };
    if created {
        // The file and its size must survive a crash before the first flush, and so must the
        // directory entry that names it.
        file.sync_all().map_err(context("fsync"))?;
        sync_parent(path).map_err(context("fsync the directory of"))?;
    }

    let (logical, physical) = block_sizes(&file, kind, path)?;
    let direct = if options.direct {
        Some(direct_align(&file, kind, logical, path)?)
    } else {
        None
    };
    let min_io = match (direct, kind) {
        (Some(direct), _) => direct.offset,
        // The kernel refuses unaligned fallocate on block devices even when buffered.
        (None, Kind::BlockDevice) => logical,
        (None, Kind::Regular) => 1,
    };
    // Bytes past the last whole block cannot be reached with aligned requests; clients
    // expect the size to be a multiple of the block size anyway.
    let usable = size - size % u64::from(min_io);
    if usable != size {
        tracing::warn!(
            path = %path.display(), size, usable,
            "size is not a multiple of the O_DIRECT alignment; exporting the aligned part"
        );
    }

    let geometry = Geometry {
        min_io,
        logical_block: logical.max(min_io),
        physical_block: physical.max(logical).max(min_io),
        preferred_io: physical.max(4096).max(min_io),
        ..Geometry::byte_addressable(usable)
    };
    let rotational = kind == Kind::BlockDevice && is_rotational(&meta);
    Ok(Opened {
        backing: Backing {
            syncs: Syncs::open(&file, path, DESCRIPTIONS, options.read_only)
                .map_err(|e| BlockError::io(format!("open {} for syncs", path.display()), e))?,
            file,
            path: path.to_path_buf(),
            kind,
            direct_align: direct.map(|d| d.memory),
        },
        geometry,
        rotational,
    })
}

/// Opens the path, creating it when a size is given and it does not exist yet.
/// Returns whether we created it.
fn open_file(options: &FileOptions) -> io::Result<(File, bool)> {
    let mut open = OpenOptions::new();
    open.read(true).write(!options.read_only);
    if options.direct {
        // O_DIRECT fits in an int on every Linux architecture.
        open.custom_flags(OFlags::DIRECT.bits() as i32);
    }
    if options.read_only || options.size.is_none() {
        return Ok((open.open(&options.path)?, false));
    }
    // create_new rather than create, to know whether the directory entry is new.
    match open.clone().create_new(true).open(&options.path) {
        Ok(file) => Ok((file, true)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Ok((open.open(&options.path)?, false))
        }
        Err(e) => Err(e),
    }
}

fn regular_size(file: &File, options: &FileOptions, current: u64) -> Result<u64> {
    let path = options.path.display();
    match options.size {
        Some(wanted) if current < wanted => {
            if options.read_only {
                return Err(BlockError::InvalidArgument(format!(
                    "{path} has {current} bytes, fewer than the {wanted} asked for, \
                     and is opened read-only"
                )));
            }
            // set_len leaves the new tail sparse: growing costs no space until written.
            file.set_len(wanted)
                .and_then(|()| file.sync_all())
                .map_err(|e| BlockError::io(format!("grow {path} to {wanted} bytes"), e))?;
            if current > 0 {
                tracing::info!(path = %path, from = current, to = wanted, "grew backing file");
            }
            Ok(wanted)
        }
        Some(wanted) if current > wanted => {
            tracing::warn!(
                path = %path, size = current, wanted,
                "backing file is larger than asked for; keeping its size"
            );
            Ok(current)
        }
        _ => Ok(current),
    }
}

fn block_device_size(mut file: &File, options: &FileOptions) -> Result<u64> {
    let path = options.path.display();
    let size = file
        .seek(io::SeekFrom::End(0))
        .map_err(|e| BlockError::io(format!("seek to the end of {path}"), e))?;
    match options.size {
        Some(wanted) if wanted > size => Err(BlockError::InvalidArgument(format!(
            "block device {path} has {size} bytes, fewer than the {wanted} asked for"
        ))),
        Some(wanted) if wanted < size => {
            tracing::warn!(
                path = %path, size, wanted,
                "block device is larger than asked for; exporting all of it"
            );
            Ok(size)
        }
        _ => Ok(size),
    }
}

/// Logical and physical block sizes. Files report those of a 512e disk, which every client
/// accepts.
fn block_sizes(file: &File, kind: Kind, path: &Path) -> Result<(u32, u32)> {
    if kind == Kind::Regular {
        return Ok((512, 4096));
    }
    let ioctl_error = |name: &str| {
        let context = format!("{name} {}", path.display());
        move |e: rustix::io::Errno| BlockError::io(context, e.into())
    };
    let logical = rustix::fs::ioctl_blksszget(file).map_err(ioctl_error("BLKSSZGET"))?;
    let physical = rustix::fs::ioctl_blkpbszget(file).map_err(ioctl_error("BLKPBSZGET"))?;
    Ok((logical, physical))
}

fn direct_align(file: &File, kind: Kind, logical: u32, path: &Path) -> Result<DirectAlign> {
    // 4 KiB covers the memory alignment of every common device and is a page, which the
    // allocator hands out cheaply.
    const SAFE: u32 = 4096;
    if kind == Kind::BlockDevice {
        return Ok(DirectAlign {
            offset: logical,
            memory: to_usize(logical.max(SAFE)),
        });
    }
    // statx reports a file system's real O_DIRECT alignment since Linux 6.1.
    match rustix::fs::statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        Ok(st) if StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::DIOALIGN) => {
            if st.stx_dio_offset_align == 0 {
                tracing::warn!(path = %path.display(), "file system refuses O_DIRECT here");
                return Err(BlockError::Unsupported("O_DIRECT on this file"));
            }
            Ok(DirectAlign {
                offset: st.stx_dio_offset_align,
                memory: to_usize(st.stx_dio_mem_align.max(SAFE).next_power_of_two()),
            })
        }
        _ => Ok(DirectAlign {
            offset: SAFE,
            memory: to_usize(SAFE),
        }),
    }
}

fn to_usize(n: u32) -> usize {
    // Linux runs on 32- and 64-bit targets only.
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn sync_parent(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// Whether sysfs calls the disk rotational. Partitions keep their queue in the parent disk.
fn is_rotational(meta: &Metadata) -> bool {
    let rdev = meta.rdev();
    let base = format!(
        "/sys/dev/block/{}:{}",
        rustix::fs::major(rdev),
        rustix::fs::minor(rdev)
    );
    ["queue/rotational", "../queue/rotational"]
        .iter()
        .find_map(|rel| std::fs::read_to_string(Path::new(&base).join(rel)).ok())
        .is_some_and(|text| text.trim() == "1")
}
