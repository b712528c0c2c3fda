//! The audit trail: one empty blob per term, `{prefix}{lease}.history/{term:020}`, its metadata
//! holding holder, start and end; the most recent `history_limit` terms are kept. Writes are
//! best effort: the trail never costs a lease.

use std::collections::HashMap;

use azure_core::http::RequestContent;
use azure_storage_blob::models::{BlobClientUploadOptions, BlobContainerClientListBlobsOptions, ListBlobsIncludeItem};
use futures::TryStreamExt;
use leasehold_core::{EndReason, Error, LeaseName, Result, Term, Transition};

use crate::error::{Refusal, STORE};
use crate::record::{Entry, State, now_ms};
use crate::store::AzureBlobStore;

/// How often (in terms) a grant also looks for old history blobs that the per-grant deletion
/// missed.
const SWEEP_EVERY: u64 = 100;

/// The most history blobs one sweep deletes (a store upgraded from a version that kept every
/// term catches up over several sweeps).
const SWEEP_MAX_DELETES: usize = 1000;

impl AzureBlobStore {
    fn history_prefix(&self, lease: &LeaseName) -> String {
        format!("{}.history/", self.blob_name(lease))
    }

    fn history_blob(&self, lease: &LeaseName, term: u64) -> String {
        format!("{}{term:020}", self.history_prefix(lease))
    }

    /// Writes one history blob. The trail is an audit record: a failed write is logged, never a
    /// reason to give up a lease.
    pub(crate) async fn write_history(&self, lease: &LeaseName, term: Term, entry: &Entry) {
        let options = BlobClientUploadOptions {
            metadata: Some(entry.encode()),
            ..Default::default()
        };
        let blob = self.container().blob_client(&self.history_blob(lease, term.0));
        let upload = blob.upload(RequestContent::from(Vec::new()), Some(options));
        if let Err(refusal) = self.call("upload history", upload).await {
            let error = refusal.into_error();
            tracing::warn!(lease = %lease, term = %term, %error, "cannot write the history of a term");
        }
    }

    /// Records that `term` of `holder` ended now, for `reason`.
    pub(crate) async fn end_history(&self, lease: &LeaseName, term: Term, entry: Entry, reason: EndReason) {
        let ended = Entry {
            end: Some((now_ms().max(entry.acquired_ms), reason)),
            ..entry
        };
        self.write_history(lease, term, &ended).await;
    }

    /// Keeps the history of `lease` to the most recent `history_limit` terms now that `term` is
    /// granted: deletes the blob of the term that just fell out (at the same time as the new
    /// term's blob is written, so a grant takes no longer) and, every [`SWEEP_EVERY`] terms, in
    /// a task of its own, any older blob left behind (a term skipped by a claim that lost its
    /// race leaves the blob `history_limit` terms before it; a store upgraded from a version that
    /// kept all). Best effort, like every history write.
    pub(crate) async fn prune_history(&self, lease: &LeaseName, term: Term) {
        let limit = u64::from(self.config().history_limit);
        let Some(oldest_kept) = term.0.checked_sub(limit).filter(|_| limit > 0).map(|t| t + 1) else {
            return;
        };
        self.delete_history(lease, oldest_kept - 1).await;
        if term.0.is_multiple_of(SWEEP_EVERY) {
            let store = self.clone();
            let lease = lease.clone();
            tokio::spawn(async move { store.sweep_history(&lease, oldest_kept).await });
        }
    }

    /// Deletes the history blobs of `lease` below `oldest_kept`, at most [`SWEEP_MAX_DELETES`].
    async fn sweep_history(&self, lease: &LeaseName, oldest_kept: u64) {
        let prefix = self.history_prefix(lease);
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(prefix.clone()),
            ..Default::default()
        };
        let mut stale = Vec::new();
        let mut pages = match self.container().list_blobs(Some(options)) {
            Ok(pager) => pager.into_pages(),
            Err(e) => {
                let error = self.refusal("list_blobs", &e).into_error();
                tracing::warn!(%lease, %error, "cannot list the history to prune it");
                return;
            }
        };
        while stale.len() < SWEEP_MAX_DELETES {
            let page = match self.call("list_blobs", pages.try_next()).await {
                Ok(Some(page)) => page.into_model().ok(),
                Ok(None) | Err(Refusal::NotFound(_)) => break,
                Err(refusal) => {
                    let error = refusal.into_error();
                    tracing::warn!(%lease, %error, "cannot list the history to prune it");
                    return;
                }
            };
            let Some(page) = page else { break };
            let terms = page.blob_items.into_iter().filter_map(|item| {
                let name = item.name?;
                name.strip_prefix(&prefix)?.parse::<u64>().ok()
            });
            let before = stale.len();
            stale.extend(terms.filter(|t| *t < oldest_kept));
            // Names come in order: a page past the window ends the search.
            if stale.len() == before {
                break;
            }
        }
        stale.truncate(SWEEP_MAX_DELETES);
        for term in stale {
            self.delete_history(lease, term).await;
        }
    }

    /// Deletes the history blob of one term (gone already is fine).
    async fn delete_history(&self, lease: &LeaseName, term: u64) {
        let blob = self.container().blob_client(&self.history_blob(lease, term));
        match self.call("delete history", blob.delete(None)).await {
            Ok(_) | Err(Refusal::NotFound(_)) => {}
            Err(refusal) => {
                let error = refusal.into_error();
                tracing::warn!(%lease, term, %error, "cannot delete an old history blob");
            }
        }
    }

    /// Lists the history blobs of the lease with their metadata (one request per 5,000 terms;
    /// `history_limit` keeps them to one) and decodes only the newest `limit`, then completes the
    /// latest term from the lease blob. Memory is bounded by `limit`, not by the terms listed.
    pub(crate) async fn read_history(&self, lease: &LeaseName, limit: usize) -> Result<Vec<Transition>> {
        let prefix = self.history_prefix(lease);
        let options = BlobContainerClientListBlobsOptions {
            prefix: Some(prefix.clone()),
            include: Some(vec![ListBlobsIncludeItem::Metadata]),
            ..Default::default()
        };
        let mut newest: Vec<(Term, HashMap<String, String>)> = Vec::new();
        let mut pages = match self.container().list_blobs(Some(options)) {
            Ok(pager) => pager.into_pages(),
            Err(e) => return Err(self.refusal("list_blobs", &e).into_error()),
        };
        loop {
            let page = match self.call("list_blobs", pages.try_next()).await {
                Ok(Some(page)) => page,
                Ok(None) | Err(Refusal::NotFound(_)) => break,
                Err(refusal) => return Err(refusal.into_error()),
            };
            let page = page
                .into_model()
                .map_err(|e| self.refusal("list_blobs", &e).into_error())?;
            for item in page.blob_items {
                let Some(name) = item.name else { continue };
                let Some(term) = name.strip_prefix(&prefix).and_then(|t| t.parse::<u64>().ok()) else {
                    return Err(Error::corrupt(
                        STORE,
                        lease,
                        format!("unexpected history blob {name:?}"),
                    ));
                };
                newest.push((Term(term), item.metadata.and_then(|m| m.values).unwrap_or_default()));
            }
            if newest.len() > limit.saturating_mul(2) {
                keep_newest(&mut newest, limit);
            }
        }
        keep_newest(&mut newest, limit);
        let mut entries = newest
            .into_iter()
            .map(|(term, metadata)| Ok((term, Entry::decode(lease, &metadata)?)))
            .collect::<Result<Vec<(Term, Entry)>>>()?;
        let view = self.read(lease).await?;
        if let Some(record) = &view.record {
            let granted = matches!(record.state, State::Leased | State::Broken) || view.holder().is_some();
            // A reservation names the successor, not the holder of its term: that term's own
            // blob was written when it was granted.
            if granted && !record.reserved && entries.last().is_none_or(|(term, _)| *term < record.term) {
                let entry = Entry {
                    holder: record.holder.clone(),
                    acquired_ms: record.acquired_ms,
                    end: None,
                };
                entries.push((record.term, entry));
            }
        }
        // Ends nobody recorded: a term followed by another expired (or was taken over); the
        // latest one ended the way the lease blob says, if it is no longer held.
        let next_start: Vec<Option<u64>> = (0..entries.len())
            .map(|i| entries.get(i + 1).map(|(_, e)| e.acquired_ms))
            .collect();
        let held_term = view.holder().map(|r| r.term);
        for ((term, entry), next) in entries.iter_mut().zip(next_start) {
            if entry.end.is_some() {
                continue;
            }
            entry.end = match next {
                Some(at) => Some((at, EndReason::Expired)),
                None if held_term == Some(*term) => None,
                None => view
                    .previous_end()
                    .map(|reason| (now_ms().max(entry.acquired_ms), reason)),
            };
        }
        let skip = entries.len().saturating_sub(limit);
        Ok(entries[skip..]
            .iter()
            .map(|(term, entry)| entry.transition(*term))
            .collect())
    }
}

/// Keeps the `limit` entries with the highest terms, in term order.
fn keep_newest<T>(entries: &mut Vec<(Term, T)>, limit: usize) {
    entries.sort_by_key(|(term, _)| *term);
    let skip = entries.len().saturating_sub(limit);
    entries.drain(..skip);
}
