//! One mount(2) call with every string made beforehand: the sandbox's setup runs between
//! fork and exec, where nothing may allocate.

use std::ffi::CString;
use std::path::Path;

/// One mount(2) call, prepared before fork (no allocation between fork and exec).
pub(crate) struct Mount {
    pub(crate) source: CString,
    pub(crate) target: CString,
    pub(crate) fstype: Option<CString>,
    pub(crate) flags: libc::c_ulong,
    pub(crate) data: Option<CString>,
}

pub(crate) fn cstring(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| std::io::Error::other(format!("{s:?}: a NUL in a path")))
}

pub(crate) fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::other(format!("{}: a NUL in a path", p.display())))
}

impl Mount {
    /// mount(2) with this mount's arguments.
    ///
    /// # Safety
    /// Between fork and exec (as `Sandbox`'s setup runs): a system call only.
    pub(crate) unsafe fn run(&self) -> std::io::Result<()> {
        // SAFETY: NUL-terminated strings owned by self, or null where mount(2) allows it.
        let rc = unsafe {
            libc::mount(
                self.source.as_ptr(),
                self.target.as_ptr(),
                self.fstype
                    .as_ref()
                    .map_or(std::ptr::null(), |f| f.as_ptr()),
                self.flags,
                self.data
                    .as_ref()
                    .map_or(std::ptr::null(), |d| d.as_ptr().cast()),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}
