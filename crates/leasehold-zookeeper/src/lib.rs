//! zookeeper lease store (under construction).
