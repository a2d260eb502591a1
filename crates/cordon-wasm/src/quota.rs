//! The scratch disk limit, enforced where guests write: WASI host functions that add bytes
//! or entries to `/work` are shadowed by versions that reserve the space first (see
//! [`DiskQuota`]) and answer "no space" when it does not fit.
//!
//! Preview 2 (components): file output streams are wrapped as they are created, and
//! `descriptor.write`, `set-size`, `open-at`, `create-directory-at`, `symlink-at` and
//! `link-at` reserve first. Preview 1 (modules): `fd_write`/`fd_pwrite` to any descriptor
//! but stdio, `fd_filestat_set_size`, `fd_allocate`, `path_open`, `path_create_directory`,
//! `path_symlink` and `path_link` reserve first; `fd_renumber` onto or from 0-2 is refused
//! and `fd_close` of 0-2 is a no-op, so descriptors 0-2 are always the captured stdio. The
//! shadows call wasmtime-wasi's own preview 1 functions with the caller's memory.

use std::sync::Arc;

use bytes::Bytes;
use wasmtime::Caller;
use wasmtime::component::Resource;
use wasmtime_wasi::filesystem::WasiFilesystemView;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p1::wasi_snapshot_preview1 as p1gen;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, DescriptorFlags, ErrorCode, Host as FsHost, HostDescriptor, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};

use crate::host::{DiskQuota, ENTRY_COST};

/// Store state that has a disk quota.
pub(crate) trait HasQuota {
    fn quota(&self) -> &Arc<DiskQuota>;
}

const FS_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// A file output stream that reserves every byte before it is written.
struct QuotaStream {
    inner: DynOutputStream,
    quota: Arc<DiskQuota>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for QuotaStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for QuotaStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if !self.quota.reserve(bytes.len() as u64) {
            return Err(StreamError::LastOperationFailed(wasmtime::format_err!(
                "no space left on device: the sandbox's disk limit is reached"
            )));
        }
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

type FsRes<T> = wasmtime::Result<(Result<T, ErrorCode>,)>;

fn convert<T: WasiFilesystemView>(
    state: &mut T,
    r: Result<impl Sized, wasmtime_wasi::p2::FsError>,
) -> wasmtime::Result<Result<(), ErrorCode>> {
    match r {
        Ok(_) => Ok(Ok(())),
        Err(e) => Ok(Err(FsHost::convert_error_code(&mut state.filesystem(), e)?)),
    }
}

fn wrap_stream<T: WasiFilesystemView + HasQuota>(
    state: &mut T,
    r: Result<Resource<DynOutputStream>, wasmtime_wasi::p2::FsError>,
) -> FsRes<Resource<DynOutputStream>> {
    match r {
        Ok(res) => {
            let quota = state.quota().clone();
            let view = state.filesystem();
            let slot = view.table.get_mut(&res)?;
            let inner = std::mem::replace(slot, Box::new(Empty));
            *slot = Box::new(QuotaStream { inner, quota });
            Ok((Ok(res),))
        }
        Err(e) => Ok((Err(FsHost::convert_error_code(&mut state.filesystem(), e)?),)),
    }
}

/// A placeholder that lives in a table slot for the instant it takes to wrap a stream.
struct Empty;

#[wasmtime_wasi::async_trait]
impl Pollable for Empty {
    async fn ready(&mut self) {}
}

impl OutputStream for Empty {
    fn write(&mut self, _bytes: Bytes) -> StreamResult<()> {
        Err(StreamError::Closed)
    }
    fn flush(&mut self) -> StreamResult<()> {
        Err(StreamError::Closed)
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Err(StreamError::Closed)
    }
}

/// Shadows the preview 2 filesystem functions that use space.
pub(crate) fn shadow_p2<T>(linker: &mut wasmtime::component::Linker<T>) -> wasmtime::Result<()>
where
    T: WasiFilesystemView + HasQuota + Send + 'static,
{
    linker.allow_shadowing(true);
    let mut inst = linker.instance(FS_TYPES)?;
    shadow_p2_streams(&mut inst)?;
    shadow_p2_writes(&mut inst)?;
    shadow_p2_entries(&mut inst)
}

/// A preview 2 linker's `wasi:filesystem/types` instance.
type FsTypes<'a, T> = wasmtime::component::LinkerInstance<'a, T>;

/// File output streams are wrapped in a [`QuotaStream`] as they are made.
fn shadow_p2_streams<T>(inst: &mut FsTypes<'_, T>) -> wasmtime::Result<()>
where
    T: WasiFilesystemView + HasQuota + Send + 'static,
{
    inst.func_wrap(
        "[method]descriptor.write-via-stream",
        |mut store, (fd, offset): (Resource<Descriptor>, u64)| {
            let state = store.data_mut();
            let r = HostDescriptor::write_via_stream(&mut state.filesystem(), fd, offset);
            wrap_stream(state, r)
        },
    )?;
    inst.func_wrap(
        "[method]descriptor.append-via-stream",
        |mut store, (fd,): (Resource<Descriptor>,)| {
            let state = store.data_mut();
            let r = HostDescriptor::append_via_stream(&mut state.filesystem(), fd);
            wrap_stream(state, r)
        },
    )?;
    Ok(())
}

/// Writes and size changes reserve their bytes first.
fn shadow_p2_writes<T>(inst: &mut FsTypes<'_, T>) -> wasmtime::Result<()>
where
    T: WasiFilesystemView + HasQuota + Send + 'static,
{
    inst.func_wrap_async(
        "[method]descriptor.write",
        |mut store, (fd, buf, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                let state = store.data_mut();
                if !state.quota().reserve(buf.len() as u64) {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r = HostDescriptor::write(&mut state.filesystem(), fd, buf, offset).await;
                match r {
                    Ok(n) => Ok((Ok(n),)),
                    Err(e) => Ok((Err(FsHost::convert_error_code(&mut state.filesystem(), e)?),)),
                }
            })
        },
    )?;
    inst.func_wrap_async(
        "[method]descriptor.set-size",
        |mut store, (fd, size): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                let state = store.data_mut();
                if !state.quota().reserve(size) {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r = HostDescriptor::set_size(&mut state.filesystem(), fd, size).await;
                Ok((convert(state, r)?,))
            })
        },
    )?;
    Ok(())
}

/// Calls that add an entry (a created file, a directory, a link) reserve its cost first.
fn shadow_p2_entries<T>(inst: &mut FsTypes<'_, T>) -> wasmtime::Result<()>
where
    T: WasiFilesystemView + HasQuota + Send + 'static,
{
    inst.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store,
         (fd, pflags, path, oflags, flags): (
            Resource<Descriptor>,
            PathFlags,
            String,
            OpenFlags,
            DescriptorFlags,
        )| {
            Box::new(async move {
                let state = store.data_mut();
                if oflags.contains(OpenFlags::CREATE) && !state.quota().reserve(ENTRY_COST) {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r = HostDescriptor::open_at(
                    &mut state.filesystem(),
                    fd,
                    pflags,
                    path,
                    oflags,
                    flags,
                )
                .await;
                match r {
                    Ok(d) => Ok((Ok(d),)),
                    Err(e) => Ok((Err(FsHost::convert_error_code(&mut state.filesystem(), e)?),)),
                }
            })
        },
    )?;
    inst.func_wrap_async(
        "[method]descriptor.create-directory-at",
        |mut store, (fd, path): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let state = store.data_mut();
                if !state.quota().reserve(ENTRY_COST) {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r =
                    HostDescriptor::create_directory_at(&mut state.filesystem(), fd, path).await;
                Ok((convert(state, r)?,))
            })
        },
    )?;
    inst.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store, (fd, old, new): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                let state = store.data_mut();
                if !state.quota().reserve(ENTRY_COST) {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r = HostDescriptor::symlink_at(&mut state.filesystem(), fd, old, new).await;
                Ok((convert(state, r)?,))
            })
        },
    )?;
    inst.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store,
         (fd, oflags, old, newfd, new): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                let state = store.data_mut();
                if !state.quota().reserve(ENTRY_COST) {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r =
                    HostDescriptor::link_at(&mut state.filesystem(), fd, oflags, old, newfd, new)
                        .await;
                Ok((convert(state, r)?,))
            })
        },
    )?;
    Ok(())
}

/// Store state with a preview 1 context.
pub(crate) trait HasP1Ctx: HasQuota {
    fn p1(&mut self) -> &mut WasiP1Ctx;
}

const P1: &str = "wasi_snapshot_preview1";
const ERRNO_BADF: i32 = 8;
const ERRNO_FAULT: i32 = 21;
const ERRNO_NOSPC: i32 = 51;
const ERRNO_NOTSUP: i32 = 58;
const OFLAGS_CREAT: i32 = 1;

/// Sum of the lengths of a guest's iovec array, or None when it is out of bounds.
fn iovec_total<T>(caller: &mut Caller<'_, T>, iovs: i32, n: i32) -> Option<u64> {
    let mem = caller.get_export("memory")?.into_memory()?;
    let data = mem.data(&caller);
    let start = usize::try_from(iovs as u32).ok()?;
    let count = usize::try_from(n as u32).ok()?;
    let bytes = data.get(start..start.checked_add(count.checked_mul(8)?)?)?;
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| u64::from(u32::from_le_bytes([c[4], c[5], c[6], c[7]])))
            .sum(),
    )
}

fn reserve<T: HasQuota>(caller: &Caller<'_, T>, n: u64) -> bool {
    caller.data().quota().reserve(n)
}

/// Calls wasmtime-wasi's own implementation of a preview 1 function with the calling
/// instance's memory, as its linker glue does.
macro_rules! forward {
    (sync $caller:expr, $func:ident, ($($a:expr),*)) => {{
        let Some(mem) = $caller
            .get_export("memory")
            .and_then(wasmtime::Extern::into_memory)
        else {
            return Err(wasmtime::format_err!("the module exports no memory for WASI calls"));
        };
        let fuel = wasmtime::AsContextMut::as_context_mut(&mut $caller).hostcall_fuel();
        let (data, state) = mem.data_and_store_mut(&mut $caller);
        p1gen::WasiSnapshotPreview1::set_hostcall_fuel(state.p1(), fuel);
        let mut memory = wiggle::GuestMemory::Unshared(data);
        p1gen::$func(state.p1(), &mut memory, $($a),*)
    }};
    ($caller:expr, $func:ident, ($($a:expr),*)) => {{
        let Some(mem) = $caller
            .get_export("memory")
            .and_then(wasmtime::Extern::into_memory)
        else {
            return Err(wasmtime::format_err!("the module exports no memory for WASI calls"));
        };
        let fuel = wasmtime::AsContextMut::as_context_mut(&mut $caller).hostcall_fuel();
        let (data, state) = mem.data_and_store_mut(&mut $caller);
        p1gen::WasiSnapshotPreview1::set_hostcall_fuel(state.p1(), fuel);
        let mut memory = wiggle::GuestMemory::Unshared(data);
        p1gen::$func(state.p1(), &mut memory, $($a),*).await
    }};
}

/// Shadows the preview 1 functions that use space or could move stdio.
pub(crate) fn shadow_p1<T>(linker: &mut wasmtime::Linker<T>) -> wasmtime::Result<()>
where
    T: HasP1Ctx + Send + 'static,
{
    linker.allow_shadowing(true);
    shadow_p1_writes(linker)?;
    shadow_p1_entries(linker)?;
    shadow_p1_stdio(linker)
}

/// Writes to any descriptor but stdio, size changes and allocations reserve their bytes
/// first.
fn shadow_p1_writes<T>(linker: &mut wasmtime::Linker<T>) -> wasmtime::Result<()>
where
    T: HasP1Ctx + Send + 'static,
{
    linker.func_wrap_async(
        P1,
        "fd_write",
        |mut caller: Caller<'_, T>, (fd, iovs, n, out): (i32, i32, i32, i32)| {
            Box::new(async move {
                if fd > 2 {
                    let Some(total) = iovec_total(&mut caller, iovs, n) else {
                        return Ok(ERRNO_FAULT);
                    };
                    if !reserve(&caller, total) {
                        return Ok(ERRNO_NOSPC);
                    }
                }
                forward!(caller, fd_write, (fd, iovs, n, out))
            })
        },
    )?;
    linker.func_wrap_async(
        P1,
        "fd_pwrite",
        |mut caller: Caller<'_, T>, (fd, iovs, n, off, out): (i32, i32, i32, i64, i32)| {
            Box::new(async move {
                if fd > 2 {
                    let Some(total) = iovec_total(&mut caller, iovs, n) else {
                        return Ok(ERRNO_FAULT);
                    };
                    if !reserve(&caller, total) {
                        return Ok(ERRNO_NOSPC);
                    }
                }
                forward!(caller, fd_pwrite, (fd, iovs, n, off, out))
            })
        },
    )?;
    linker.func_wrap_async(
        P1,
        "fd_filestat_set_size",
        |mut caller: Caller<'_, T>, (fd, size): (i32, i64)| {
            Box::new(async move {
                if !reserve(&caller, size as u64) {
                    return Ok(ERRNO_NOSPC);
                }
                forward!(caller, fd_filestat_set_size, (fd, size))
            })
        },
    )?;
    linker.func_wrap_async(
        P1,
        "fd_allocate",
        |mut caller: Caller<'_, T>, (fd, off, len): (i32, i64, i64)| {
            Box::new(async move {
                if !reserve(&caller, len as u64) {
                    return Ok(ERRNO_NOSPC);
                }
                forward!(sync caller, fd_allocate, (fd, off, len))
            })
        },
    )?;
    Ok(())
}

/// Calls that add an entry (a created file, a directory, a link) reserve its cost first.
fn shadow_p1_entries<T>(linker: &mut wasmtime::Linker<T>) -> wasmtime::Result<()>
where
    T: HasP1Ctx + Send + 'static,
{
    linker.func_wrap_async(
        P1,
        "path_open",
        |mut caller: Caller<'_, T>,
         (dirfd, dirflags, p, plen, oflags, base, inh, fdflags, out): (
            i32,
            i32,
            i32,
            i32,
            i32,
            i64,
            i64,
            i32,
            i32,
        )| {
            Box::new(async move {
                if oflags & OFLAGS_CREAT != 0 && !reserve(&caller, ENTRY_COST) {
                    return Ok(ERRNO_NOSPC);
                }
                forward!(
                    caller,
                    path_open,
                    (dirfd, dirflags, p, plen, oflags, base, inh, fdflags, out)
                )
            })
        },
    )?;
    linker.func_wrap_async(
        P1,
        "path_create_directory",
        |mut caller: Caller<'_, T>, (fd, p, plen): (i32, i32, i32)| {
            Box::new(async move {
                if !reserve(&caller, ENTRY_COST) {
                    return Ok(ERRNO_NOSPC);
                }
                forward!(caller, path_create_directory, (fd, p, plen))
            })
        },
    )?;
    linker.func_wrap_async(
        P1,
        "path_symlink",
        |mut caller: Caller<'_, T>, (a, alen, fd, b, blen): (i32, i32, i32, i32, i32)| {
            Box::new(async move {
                if !reserve(&caller, ENTRY_COST) {
                    return Ok(ERRNO_NOSPC);
                }
                forward!(caller, path_symlink, (a, alen, fd, b, blen))
            })
        },
    )?;
    linker.func_wrap_async(
        P1,
        "path_link",
        |mut caller: Caller<'_, T>,
         (ofd, ofl, a, alen, nfd, b, blen): (i32, i32, i32, i32, i32, i32, i32)| {
            Box::new(async move {
                if !reserve(&caller, ENTRY_COST) {
                    return Ok(ERRNO_NOSPC);
                }
                forward!(caller, path_link, (ofd, ofl, a, alen, nfd, b, blen))
            })
        },
    )?;
    Ok(())
}

/// Descriptors 0-2 stay the captured stdio: never renumbered onto or from, and closing one
/// is a no-op.
fn shadow_p1_stdio<T>(linker: &mut wasmtime::Linker<T>) -> wasmtime::Result<()>
where
    T: HasP1Ctx + Send + 'static,
{
    linker.func_wrap_async(
        P1,
        "fd_renumber",
        |mut caller: Caller<'_, T>, (from, to): (i32, i32)| {
            Box::new(async move {
                if (0..=2).contains(&from) || (0..=2).contains(&to) {
                    return Ok(ERRNO_NOTSUP);
                }
                forward!(caller, fd_renumber, (from, to))
            })
        },
    )?;
    linker.func_wrap_async(
        P1,
        "fd_close",
        |mut caller: Caller<'_, T>, (fd,): (i32,)| {
            Box::new(async move {
                if (0..=2).contains(&fd) {
                    return Ok(0);
                }
                if fd < 0 {
                    return Ok(ERRNO_BADF);
                }
                forward!(caller, fd_close, (fd))
            })
        },
    )?;
    Ok(())
}
