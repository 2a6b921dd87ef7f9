//! Std locks on request paths: a panic while one is held leaves the device's in-memory state
//! possibly half-updated. `lock().unwrap()` would turn that into a panic of every later
//! request (and, with `panic = "abort"`, of the server); [`check`] turns it into a clear
//! failure of that one device instead:
//!
//! ```ignore
//! let table = poison::check(self.table.lock(), &self.name, "the member table")?;
//! ```

use std::sync::LockResult;

use crate::{BlockError, Result};

/// The guard of a lock just taken (`lock()`, `read()`, `write()`), or, if a panic poisoned
/// it, a failure naming `device` and `what` the lock guards.
pub fn check<G>(taken: LockResult<G>, device: &str, what: &'static str) -> Result<G> {
    taken.map_err(|_| BlockError::Poisoned {
        device: device.to_string(),
        what,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, RwLock};

    use super::*;

    #[test]
    fn a_poisoned_lock_is_a_failure_of_the_device_not_a_panic() {
        let table = Arc::new(Mutex::new(1));
        let shared = RwLock::new(2);
        assert_eq!(*check(table.lock(), "m0", "the table").unwrap(), 1);
        assert_eq!(*check(shared.read(), "m0", "the map").unwrap(), 2);
        assert_eq!(*check(shared.write(), "m0", "the map").unwrap(), 2);
        let poisoner = table.clone();
        let _ = std::thread::spawn(move || {
            let _held = poisoner.lock().unwrap();
            panic!("planted");
        })
        .join();
        let error = check(table.lock(), "m0", "the table").err().unwrap();
        assert!(
            matches!(error, BlockError::Poisoned { ref device, what: "the table" } if device == "m0")
        );
        assert_eq!(error.errno(), crate::errno::EIO);
    }
}
