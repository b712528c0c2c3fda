//! etcd lease store (under construction).
