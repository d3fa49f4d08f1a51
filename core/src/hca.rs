//! hca (in progress).
