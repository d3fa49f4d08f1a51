//! mr_cache (in progress).
