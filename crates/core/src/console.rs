//! Printing for the command-line tools when the reader may be gone.
//!
//! `print!` panics on EPIPE (`strata status | head`, `strata sim models | head`), and the
//! binaries abort on panic, perhaps in the middle of a repair or a change. These macros write
//! the same text and drop what a closed pipe cannot take.

/// `print!` that drops what a closed pipe cannot take.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `println!` that drops what a closed pipe cannot take; see [`out!`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` that drops what a closed pipe cannot take; see [`out!`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}
