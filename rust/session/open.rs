//! Opening: each file's source, its header and index (read concurrently
//! for the files of a set), and the checks that let several files act as
//! one.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::discover::{discover, probing};
use super::seen::Seen;
use super::{Member, TensorFile};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::runtime;
use crate::format::Index;
use crate::io::{open_source, spanned, RangeSource, SourceOptions, Spanned};
use crate::location::Location;

/// Header reads in flight at once when a set is opened.
const OPEN_CONCURRENCY: usize = 64;

/// One file, opened: its source, index, size, discovery counters and what
/// its discovery saw of the store (`discover::probing`).
type Opened = (Arc<dyn RangeSource>, Index, u64, (u64, u64), Option<Seen>);

impl TensorFile {
    /// Fetches and validates the header and index; stops once `cancel` is
    /// cancelled or the source options' deadline passes.
    pub fn open(loc: &Location, opts: &SourceOptions, cancel: &CancelToken) -> Result<TensorFile> {
        TensorFile::open_set(loc.display(), std::slice::from_ref(loc), opts, cancel)
    }

    /// Opens `files` as one: their headers read concurrently, their tensors
    /// listed file by file, loaded by one plan. Tensor names must be unique
    /// across the files, which must share a format and encryption. `uri`
    /// names the set (a checkpoint's directory) where no one file is meant.
    pub fn open_set(
        uri: &str,
        files: &[Location],
        opts: &SourceOptions,
        cancel: &CancelToken,
    ) -> Result<TensorFile> {
        if files.is_empty() || files.len() > spanned::MAX_MEMBERS {
            return Err(Error::invalid(format!(
                "a set holds 1 to {} files, not {}",
                spanned::MAX_MEMBERS,
                files.len()
            ))
            .with_uri(uri));
        }
        let cancel = cancel.child_with_budget(opts.deadline);
        let opened = runtime()?.block_on(open_all(files, opts, &cancel))?;
        let mut sources = Vec::with_capacity(opened.len());
        let mut members = Vec::with_capacity(opened.len());
        let mut discovery = (0, 0);
        let seen = opened.first().and_then(|o| o.4);
        for (source, index, size, (requests, bytes), _) in opened {
            discovery = (discovery.0 + requests, discovery.1 + bytes);
            members.push(Member {
                uri: source.uri().to_string(),
                index,
                size,
            });
            sources.push(source);
        }
        let catalog = catalog(&members)?;
        let name = if files.len() == 1 {
            members[0].uri()
        } else {
            uri
        };
        Ok(TensorFile {
            source: Arc::new(Spanned::new(name.to_string(), sources)?),
            members,
            catalog,
            deadline: opts.deadline,
            discovery_stats: discovery,
            seen,
        })
    }
}

/// Opens every file, at most `OPEN_CONCURRENCY` at once; in `files` order.
/// The first failure is returned (the others are dropped, unfinished).
async fn open_all(
    files: &[Location],
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<Vec<Opened>> {
    let room = Arc::new(Semaphore::new(OPEN_CONCURRENCY));
    let mut tasks = JoinSet::new();
    for (i, loc) in files.iter().enumerate() {
        let (loc, opts, cancel, room) = (loc.clone(), opts.clone(), cancel.clone(), room.clone());
        tasks.spawn(async move {
            let _permit = room.acquire_owned().await;
            let source = open_source(&loc, &opts).await?;
            // One probe a set: its files share a store.
            let found = match i {
                0 => probing(&source, &cancel).await,
                _ => discover(&source, &cancel).await,
            }
            .map_err(|e| e.with_uri(source.uri()))?;
            let stats = (found.requests, found.bytes);
            let opened = (source, found.index, found.size, stats, found.seen);
            Ok::<_, Error>((i, opened))
        });
    }
    let mut out: Vec<Option<Opened>> = (0..files.len()).map(|_| None).collect();
    while let Some(done) = tasks.join_next().await {
        let (i, opened) =
            done.map_err(|e| Error::new(ErrorKind::Io, format!("opening a file failed: {e}")))??;
        out[i] = Some(opened);
    }
    Ok(out.into_iter().flatten().collect())
}

/// Every tensor of every member as `(member, entry)`, after checking that
/// the members can act as one file.
fn catalog(members: &[Member]) -> Result<Vec<(usize, usize)>> {
    let first = &members[0];
    let mut owner: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (m, member) in members.iter().enumerate() {
        let ctx = |e: Error| e.with_uri(member.uri());
        if members.len() > 1 {
            check_member(first, member).map_err(ctx)?;
        }
        for (e, entry) in member.index.entries.iter().enumerate() {
            let name = entry.display_name();
            if let Some(&other) = owner.get(&name) {
                return Err(ctx(Error::format(format!(
                    "two files claim tensor \"{name}\": {} and {}",
                    members[other].uri(),
                    member.uri()
                ))
                .with_tensor(name)
                .with_range(entry.data_range())));
            }
            if members.len() > 1 {
                owner.insert(name, m);
            }
            out.push((m, e));
        }
    }
    Ok(out)
}

/// A member of a set must fit the address space and match the first file.
fn check_member(first: &Member, member: &Member) -> Result<()> {
    if member.size > spanned::MAX_MEMBER_BYTES {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "a file of {} bytes cannot be one of a set (at most {} bytes each)",
                member.size,
                spanned::MAX_MEMBER_BYTES
            ),
        ));
    }
    let (a, b) = (&first.index, &member.index);
    if a.format_name() != b.format_name() || a.has_crypt_info() != b.has_crypt_info() {
        return Err(Error::format(format!(
            "the files of a set must share a format and encryption: {} is {}{}, {} is {}{}",
            first.uri(),
            a.format_name(),
            if a.has_crypt_info() {
                " (encrypted)"
            } else {
                ""
            },
            member.uri(),
            b.format_name(),
            if b.has_crypt_info() {
                " (encrypted)"
            } else {
                ""
            },
        )));
    }
    Ok(())
}
