//! Taking a lease: a claim in the blob's metadata (compare-and-set on the ETag), the blob lease
//! under that claim, then the record marked leased. Every step is recognisable by reading the
//! blob back (the claim names the candidate; the lease id is derived from it).

use std::time::Duration;

use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::models::{
    BlobClientAcquireLeaseOptions, BlobClientChangeLeaseOptions, BlobClientSetMetadataOptions, BlobClientUploadOptions,
};
use leasehold_core::{AcquireRequest, Acquired, Error, Grant, LeaseName, Result, Term};

use crate::error::{Refusal, STORE};
use crate::record::{Entry, Record, State, Token, View, etag_of, lease_id, lease_seconds, now_ms, reserved_lease_id};
use crate::store::AzureBlobStore;

impl AzureBlobStore {
    /// Writes `record` if the blob is still as `view` saw it: the compare-and-set of a claim.
    /// Answers the new ETag, or `None` when the blob changed (a lost race).
    pub(crate) async fn claim(
        &self,
        lease: &LeaseName,
        view: &View,
        record: &Record,
        own: Option<&str>,
    ) -> Result<Option<String>> {
        let Some(etag) = &view.etag else {
            return self.create(lease, record).await;
        };
        let options = BlobClientSetMetadataOptions {
            if_match: Some(Etag::from(etag.clone())),
            lease_id: own.map(str::to_string),
            ..Default::default()
        };
        match self
            .call(
                "set_metadata",
                self.blob(lease).set_metadata(&record.encode(), Some(options)),
            )
            .await
        {
            Ok(reply) => Ok(Some(etag_of(lease, reply.headers())?)),
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => Ok(None),
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// Creates the lease blob with `record` in it, if it does not exist yet; a missing container
    /// is created first.
    pub(crate) async fn create(&self, lease: &LeaseName, record: &Record) -> Result<Option<String>> {
        match self.upload_new(lease, record).await {
            Err(Refusal::NotFound(_)) => {
                self.create_container().await?;
                self.upload_new(lease, record).await
            }
            other => other,
        }
        .or_else(|refusal| match refusal {
            Refusal::Conflict(_) | Refusal::NotFound(_) => Ok(None),
            Refusal::Failed(e) => Err(e),
        })
    }

    /// `Put Blob` with `If-None-Match: *`.
    pub(crate) async fn upload_new(
        &self,
        lease: &LeaseName,
        record: &Record,
    ) -> std::result::Result<Option<String>, Refusal> {
        let options = BlobClientUploadOptions {
            metadata: Some(record.encode()),
            ..Default::default()
        }
        .if_not_exists();
        let blob = self.blob(lease);
        let reply = self
            .call("upload", blob.upload(RequestContent::from(Vec::new()), Some(options)))
            .await?;
        let etag = reply
            .etag
            .ok_or_else(|| Refusal::Failed(Error::store(STORE, "upload answered without an ETag")))?;
        Ok(Some(etag.to_string()))
    }

    pub(crate) async fn create_container(&self) -> Result<()> {
        match self.call("create_container", self.container().create(None)).await {
            Ok(_) | Err(Refusal::Conflict(_)) => Ok(()),
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// Takes the blob lease for `id` if the blob still carries the claim `etag`.
    pub(crate) async fn take_lease(
        &self,
        lease: &LeaseName,
        id: &str,
        ttl: Duration,
        etag: &str,
    ) -> std::result::Result<(), Refusal> {
        let options = BlobClientAcquireLeaseOptions {
            proposed_lease_id: Some(id.to_string()),
            if_match: Some(Etag::from(etag.to_string())),
            ..Default::default()
        };
        self.call(
            "acquire_lease",
            self.blob(lease).acquire_lease(lease_seconds(ttl), Some(options)),
        )
        .await
        .map(drop)
    }

    /// Changes the active blob lease `from` one id `to` another (Azure's Change Lease, which
    /// keeps the lease's expiry), if the blob still carries `etag`.
    pub(crate) async fn change_lease(
        &self,
        lease: &LeaseName,
        from: &str,
        to: &str,
        etag: &str,
    ) -> std::result::Result<(), Refusal> {
        let options = BlobClientChangeLeaseOptions {
            if_match: Some(Etag::from(etag.to_string())),
            ..Default::default()
        };
        self.call(
            "change_lease",
            self.blob(lease)
                .change_lease(from.to_string(), to.to_string(), Some(options)),
        )
        .await
        .map(drop)
    }

    /// Marks the claim as leased, under the lease: answers the new ETag.
    pub(crate) async fn confirm(
        &self,
        lease: &LeaseName,
        record: &Record,
        id: &str,
        etag: &str,
    ) -> std::result::Result<String, Refusal> {
        let options = BlobClientSetMetadataOptions {
            if_match: Some(Etag::from(etag.to_string())),
            lease_id: Some(id.to_string()),
            ..Default::default()
        };
        let reply = self
            .call(
                "set_metadata",
                self.blob(lease).set_metadata(&record.encode(), Some(options)),
            )
            .await?;
        etag_of(lease, reply.headers()).map_err(Refusal::Failed)
    }

    /// Claims the lease over `view` for `request.candidate` and turns the claim into a blob lease.
    /// `None` when the claim was refused (the blob changed since `view`).
    pub(crate) async fn try_claim(&self, request: &AcquireRequest, view: &View) -> Result<Option<Acquired>> {
        let (lease, me) = (&request.lease, &request.candidate);
        // Metadata anyone can write: a term of u64::MAX is bad data, not a panic or a wrap.
        let term = view.last_term().0.checked_add(1).ok_or_else(|| {
            Error::corrupt(
                STORE,
                lease,
                format!("the lease blob holds term {}, which no term can follow", u64::MAX),
            )
        })?;
        let record = Record {
            holder: me.clone(),
            term: Term(term),
            ttl: request.ttl,
            acquired_ms: now_ms(),
            state: State::Claimed,
            reserved: false,
        };
        let mine = view.leased && view.record.as_ref().is_some_and(|r| r.holder == *me);
        // Handed over to us: the blob lease has the reservation's id; make it ours, then claim
        // under it as over a lease of our own. A refused change (the lease is ours already,
        // after an acquire whose reply was lost, or gone) leaves the claim to find out.
        if let (true, Some(etag)) = (mine && view.record.as_ref().is_some_and(|r| r.reserved), &view.etag) {
            match self
                .change_lease(lease, &reserved_lease_id(lease, me), &lease_id(lease, me), etag)
                .await
            {
                Ok(()) | Err(Refusal::Conflict(_)) => {}
                Err(Refusal::NotFound(_)) => return Ok(None),
                Err(Refusal::Failed(e)) => return Err(e),
            }
        }
        let own = mine.then(|| lease_id(lease, me));
        let Some(etag) = self.claim(lease, view, &record, own.as_deref()).await? else {
            return Ok(None);
        };
        Ok(Some(match self.lease_claim(lease, &record, &etag).await? {
            Some(grant) => Acquired::Granted(grant),
            None => Acquired::Held(self.read(lease).await?.observation(lease)),
        }))
    }

    /// Turns a claim into a held blob lease: lease, then mark the record `leased`.
    /// `Ok(None)` when someone else changed the blob first.
    pub(crate) async fn lease_claim(&self, lease: &LeaseName, record: &Record, etag: &str) -> Result<Option<Grant>> {
        let id = lease_id(lease, &record.holder);
        match self.take_lease(lease, &id, record.ttl, etag).await {
            Ok(()) => {}
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => return Ok(None),
            Err(Refusal::Failed(e)) => return Err(e),
        }
        let leased = Record {
            state: State::Leased,
            ..record.clone()
        };
        let etag = match self.confirm(lease, &leased, &id, etag).await {
            Ok(etag) => etag,
            Err(Refusal::Conflict(_) | Refusal::NotFound(_)) => return Ok(None),
            Err(Refusal::Failed(e)) => return Err(e),
        };
        self.remember(
            lease,
            &View {
                etag: Some(etag.clone()),
                record: Some(leased.clone()),
                leased: true,
                lease_state: "leased".into(),
                age_secs: None,
            },
        );
        let entry = Entry {
            holder: leased.holder.clone(),
            acquired_ms: leased.acquired_ms,
            end: None,
        };
        futures::join!(
            self.write_history(lease, leased.term, &entry),
            self.prune_history(lease, leased.term)
        );
        Ok(Some(Grant {
            lease: lease.clone(),
            holder: leased.holder.clone(),
            term: leased.term,
            ttl: leased.ttl,
            token: Token {
                lease_id: id,
                etag,
                acquired_ms: leased.acquired_ms,
            }
            .to_string(),
        }))
    }
}
