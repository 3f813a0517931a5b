//! The process's open-file limit: `serve` raises its soft limit to the hard one where the
//! system allows it (a service manager's `LimitNOFILE=` sets both), so that the
//! connection caps, not the kernel, are what turn a flood away.

/// The soft open-file limit before and after raising it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub before: u64,
    pub now: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; a refusal leaves it as it was.
pub fn raise() -> std::io::Result<OpenFiles> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok(OpenFiles {
            before,
            now: before,
        });
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Ok(OpenFiles {
            before,
            now: before,
        });
    }
    Ok(OpenFiles {
        before,
        now: raised.rlim_cur,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let got = super::raise().unwrap();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(got.now, limit.rlim_cur);
        assert_eq!(limit.rlim_cur, limit.rlim_max);
        assert!(got.now >= got.before);
    }
}
