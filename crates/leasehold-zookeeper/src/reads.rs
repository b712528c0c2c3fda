//! Many reads in few requests: ZooKeeper's multi-read (3.6 and later) answers a list of
//! `getData` and `getChildren` in one request, each with its own result. Requests are chunked to
//! stay well under the server's request size limit (`jute.maxbuffer`), and every chunk is sent
//! at once. A server without multi-read (before 3.6) answers `Unimplemented`: the reads are then
//! sent one by one, as before.

use std::ops::Range;

use futures::future::join_all;
use zookeeper_client as zk;

/// The most bytes one multi-read may cost, by [`Read::cost`]: ZooKeeper refuses a request
/// larger than `jute.maxbuffer`, 1 MiB less a little by default. Half of that leaves room for
/// servers configured lower.
pub(crate) const READ_BYTES: usize = 512 * 1024;

/// One read of a multi-read.
pub(crate) enum Read {
    /// `getData` of the path.
    Data(String),
    /// `getChildren` of the path.
    Children(String),
}

impl Read {
    /// An upper bound of the bytes this read adds to a multi-read request (the path, its length,
    /// the watch flag and the op's header).
    fn cost(&self) -> usize {
        match self {
            Read::Data(path) | Read::Children(path) => path.len() + 32,
        }
    }
}

/// What one read found.
pub(crate) enum Got {
    Data(Vec<u8>, zk::Stat),
    Children(Vec<String>),
    /// The znode does not exist.
    NoNode,
}

/// Consecutive ranges of items, together covering all of them in order, each costing at most
/// `budget` (an item that costs more alone is a range of its own).
pub(crate) fn chunks(costs: impl IntoIterator<Item = usize>, budget: usize) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let (mut start, mut spent, mut end) = (0, 0, 0);
    for (k, cost) in costs.into_iter().enumerate() {
        if k > start && spent + cost > budget {
            chunks.push(start..k);
            (start, spent) = (k, 0);
        }
        spent += cost;
        end = k + 1;
    }
    if end > start {
        chunks.push(start..end);
    }
    chunks
}

/// Every read's result, in order, in one multi-read per chunk of at most `budget` bytes, all
/// chunks sent as soon as this is first polled (after any request sent before), in order. A
/// chunk that fails as a whole fails each of its reads with its error.
pub(crate) async fn read_many(
    client: &zk::Client,
    reads: &[Read],
    budget: usize,
) -> Vec<std::result::Result<Got, zk::Error>> {
    let chunks = chunks(reads.iter().map(Read::cost), budget);
    let sent = chunks.iter().map(|chunk| {
        let mut reader = client.new_multi_reader();
        let added: std::result::Result<(), zk::Error> = reads[chunk.clone()].iter().try_for_each(|read| match read {
            Read::Data(path) => reader.add_get_data(path),
            Read::Children(path) => reader.add_get_children(path),
        });
        // The request leaves here, when it is built, not when its reply is awaited.
        let sent = added.map(|()| reader.commit());
        async move {
            match sent {
                Ok(reply) => reply.await,
                Err(e) => Err(e),
            }
        }
    });
    let replies = join_all(sent.collect::<Vec<_>>()).await;
    let mut results = Vec::with_capacity(reads.len());
    for (chunk, reply) in chunks.iter().zip(replies) {
        match reply {
            Ok(answers) if answers.len() == chunk.len() => {
                results.extend(answers.into_iter().map(|answer| match answer {
                    zk::MultiReadResult::Data { data, stat } => Ok(Got::Data(data, stat)),
                    zk::MultiReadResult::Children { children } => Ok(Got::Children(children)),
                    zk::MultiReadResult::Error { err: zk::Error::NoNode } => Ok(Got::NoNode),
                    zk::MultiReadResult::Error { err } => Err(err),
                    _ => Err(zk::Error::UnexpectedError(
                        "an unknown kind of multi-read result".to_string(),
                    )),
                }));
            }
            Ok(answers) => {
                let e = zk::Error::UnexpectedError(format!(
                    "ZooKeeper answered a multi-read of {} znodes with {} results",
                    chunk.len(),
                    answers.len()
                ));
                results.extend(chunk.clone().map(|_| Err(e.clone())));
            }
            // A server before 3.6 has no multi-read: each read on its own, all at once.
            Err(zk::Error::Unimplemented) => results.extend(one_by_one(client, &reads[chunk.clone()]).await),
            Err(e) => results.extend(chunk.clone().map(|_| Err(e.clone()))),
        }
    }
    results
}

/// The reads as separate requests, sent at once.
async fn one_by_one(client: &zk::Client, reads: &[Read]) -> Vec<std::result::Result<Got, zk::Error>> {
    join_all(reads.iter().map(|read| async move {
        let got = match read {
            Read::Data(path) => client.get_data(path).await.map(|(data, stat)| Got::Data(data, stat)),
            Read::Children(path) => client.list_children(path).await.map(Got::Children),
        };
        match got {
            Err(zk::Error::NoNode) => Ok(Got::NoNode),
            other => other,
        }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_every_item_once_in_order_within_the_budget() {
        assert!(chunks([], 10).is_empty());
        assert_eq!(chunks([3, 3, 3], 10), vec![0..3]);
        assert_eq!(chunks([4, 4, 4, 4, 4], 10), vec![0..2, 2..4, 4..5]);
        // An item over the budget goes alone; the budget is never exceeded otherwise.
        assert_eq!(chunks([2, 25, 2, 2], 10), vec![0..1, 1..2, 2..4]);
        assert_eq!(chunks([10, 10], 10), vec![0..1, 1..2]);
    }
}
