//! Asking for a segment another member holds. The waiter puts `wants/<volume>/<segment>/<name>`,
//! bound to its lease (so it goes with the waiter); the holder watches the volume's wants and
//! gives the claim back as soon as nothing of its own pins it, instead of keeping it for its
//! linger time. Only a hint: the claim itself is still taken by `Coord::claim`.

use etcd_client::{EventType, PutOptions, WatchOptions, WatchStream};

use crate::keys::check_name;
use crate::session::Session;
use crate::{Coord, CoordError};

/// A change to a volume's wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WantEvent {
    Wanted { segment: u32, member: String },
    Withdrawn { segment: u32, member: String },
}

/// The wants of one volume as they change; see [`Coord::watch_wants`].
pub struct WantWatch {
    stream: WatchStream,
    prefix: String,
}

impl WantWatch {
    /// The next changes, `None` once etcd closed the watch (the caller watches again).
    pub async fn next(&mut self) -> Result<Option<Vec<WantEvent>>, CoordError> {
        loop {
            let Some(response) = self
                .stream
                .message()
                .await
                .map_err(|e| CoordError::from_etcd("watching wants", e))?
            else {
                return Ok(None);
            };
            if response.canceled() {
                return Ok(None);
            }
            // The first answer only says the watch is set up; progress notes carry nothing.
            if !response.events().is_empty() {
                return Ok(Some(self.events(&response)));
            }
        }
    }

    fn events(&self, response: &etcd_client::WatchResponse) -> Vec<WantEvent> {
        (response.events().iter())
            .filter_map(|event| {
                let kv = event.kv()?;
                let (segment, member) = parse(&self.prefix, kv.key())?;
                Some(match event.event_type() {
                    EventType::Put => WantEvent::Wanted { segment, member },
                    EventType::Delete => WantEvent::Withdrawn { segment, member },
                })
            })
            .collect()
    }
}

/// `<segment>/<member>` after the prefix; keys that do not parse are not wants.
fn parse(prefix: &str, key: &[u8]) -> Option<(u32, String)> {
    let key = std::str::from_utf8(key).ok()?;
    let (segment, member) = key.strip_prefix(prefix)?.split_once('/')?;
    Some((segment.parse().ok()?, member.to_string()))
}

impl Coord {
    /// Says this member waits for `segment` of `volume`. Bound to the session's lease.
    pub async fn want(
        &self,
        session: &Session,
        volume: &str,
        segment: u32,
    ) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        session.ensure_live()?;
        let key = self.keys.want(volume, segment, session.name());
        let mut client = self.client.clone();
        self.call(
            "asking for a segment",
            client.put(
                key,
                Vec::new(),
                Some(PutOptions::new().with_lease(session.lease())),
            ),
        )
        .await?;
        Ok(())
    }

    /// Withdraws [`Coord::want`].
    pub async fn unwant(
        &self,
        session: &Session,
        volume: &str,
        segment: u32,
    ) -> Result<(), CoordError> {
        check_name("volume", volume)?;
        let key = self.keys.want(volume, segment, session.name());
        let mut client = self.client.clone();
        self.call("withdrawing a want", client.delete(key, None))
            .await?;
        Ok(())
    }

    /// The wants standing on `volume`'s segments.
    pub async fn wanted(&self, volume: &str) -> Result<Vec<(u32, String)>, CoordError> {
        check_name("volume", volume)?;
        let prefix = self.keys.wants(volume);
        let kvs = self.list(&prefix, "listing wants").await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| parse(&prefix, kv.key()))
            .collect())
    }

    /// Watches `volume`'s wants from now on. Read [`Coord::wanted`] after it is set up to learn
    /// of the ones that stood before.
    pub async fn watch_wants(&self, volume: &str) -> Result<WantWatch, CoordError> {
        check_name("volume", volume)?;
        let prefix = self.keys.wants(volume);
        let mut client = self.client.clone();
        let stream = self
            .call(
                "watching wants",
                client.watch(prefix.as_str(), Some(WatchOptions::new().with_prefix())),
            )
            .await?;
        Ok(WantWatch { stream, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_well_formed_keys_are_wants() {
        let prefix = "/strata/c/wants/v/";
        assert_eq!(
            parse(prefix, b"/strata/c/wants/v/0000000003/h1"),
            Some((3, "h1".to_string()))
        );
        assert_eq!(parse(prefix, b"/strata/c/wants/v/x/h1"), None);
        assert_eq!(parse(prefix, b"/strata/c/wants/v/0000000003"), None);
        assert_eq!(parse(prefix, b"/strata/c/wants/vv/0000000003/h1"), None);
    }
}
