/*
 * segment.c - opening, validating, closing and removing a segment.
 * Longer than most files: these four share the checks of an untrusted
 * segment.
 *
 * This is the boundary where shared memory is untrusted input.  An existing
 * segment is trusted only if its owner and mode pass segment_trusted
 * (docs/DESIGN.md, "Trust model"), checked before it is mapped; then every
 * size and count in its header is checked against the file size and the
 * layout before anything is indexed, and every slot is checked
 * (validate.c: validate_header, validate_slots, which observers run too),
 * and the validated max_processes is kept in the private handle: no later
 * index is taken from the segment unchecked.
 *
 * Handles.  A handle (shl_lock) is process-private, named by a token
 * (handles.c).  Every entry point counts itself in h->inflight (enter/leave,
 * internal.h); shl_close refuses with SHL_EINFLIGHT while a call is in
 * flight or an attempt of this process is still registered or claims, and
 * a closed handle is recycled under a new generation, so a late call
 * through a stale token gets SHL_ECLOSED.
 */
#include "internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* The name-to-path rule, its one definition: the lock `name` is the POSIX
 * shared-memory object "/pyshmlock.<name>", which Linux keeps as the file
 * "/dev/shm/pyshmlock.<name>". */
#define SHM_FILE_DIR "/dev/shm"
#define SHM_OBJECT_PREFIX "/pyshmlock."

int shl_segment_path(const char *name, int file, char *buf, uint32_t size)
{
    if (name == NULL || !valid_name(name) || buf == NULL)
        return SHL_EINVAL;
    int n = snprintf(buf, size, "%s%s%s", file ? SHM_FILE_DIR : "", SHM_OBJECT_PREFIX, name);
    return n < 0 || (uint32_t)n >= size ? SHL_EINVAL : n;
}

int valid_name(const char *name)
{
    size_t n = strnlen(name, SHL_NAME_MAX + 1);
    if (n == 0 || n > SHL_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

size_t layout_size(uint32_t max)
{
    return sizeof(struct shl_header) + (size_t)max * sizeof(struct shl_slot);
}

static void init_segment(struct shl_header *hd, uint32_t max, int fail_closed)
{
    struct shl_slot *slots = (struct shl_slot *)(hd + 1);
    hd->magic = SHL_MAGIC;
    hd->layout_version = SHL_LAYOUT;
    hd->header_size = sizeof(struct shl_header);
    hd->slot_size = sizeof(struct shl_slot);
    hd->max_processes = max;
    hd->creator_pid = (uint32_t)getpid();
    hd->total_size = layout_size(max);
    for (uint32_t i = 0; i < max; i++)
        init_slot_mutex(&slots[i].owner);
    if (fail_closed) {
        /* A cluster host's lock: born paused, with a host lease that has
         * already passed, so no opener admits anything (and the stale reset
         * keeps the pause) until the host's agent has mirrored the cluster
         * and armed a lease of its own. */
        /* relaxed, like every field here: published by READY's release */
        atomic_store_explicit(&hd->state, ST_PAUSED, memory_order_relaxed);
        atomic_store_explicit(&hd->paused_by_pid, (uint32_t)getpid(), memory_order_relaxed);
        atomic_store_explicit(&hd->paused_at_ns, real_ns(), memory_order_relaxed);
        atomic_store_explicit(&hd->pause_count, 1, memory_order_relaxed);
        atomic_store_explicit(&hd->lease_deadline_ns, 1, memory_order_relaxed);
        atomic_store_explicit(&hd->lease_pid, (uint32_t)getpid(), memory_order_relaxed);
    }
    /* release: an opener that sees READY (acquire) sees all of the above. */
    atomic_store_explicit(&hd->ready, SHL_READY, memory_order_release);
}

/* Map an existing segment and validate it, waiting (bounded) for a creator
 * that is still initialising it. */
static int map_existing(int fd, struct shl_header **out, size_t *size, uint32_t *max,
                        uint64_t *expected, shl_corruption *why)
{
    int64_t give_up = mono_ns() + OPEN_WAIT_NS;
    for (;;) {
        struct stat st;
        if (fstat(fd, &st) != 0)
            return SHL_ESYS;
        if (!S_ISREG(st.st_mode))
            return SHL_EFOREIGN;   /* a FIFO (anyone can mkfifo in /dev/shm), ... */
        /* A creator sets the full size (ftruncate) before it writes a byte:
         * a non-empty segment shorter than our header is not one of ours. */
        if (st.st_size > 0 && (size_t)st.st_size < sizeof(struct shl_header))
            return SHL_EFOREIGN;
        if ((size_t)st.st_size >= sizeof(struct shl_header)) {
            size_t len = (size_t)st.st_size;
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED)
                return SHL_ESYS;
            struct shl_header *hd = p;
            /* acquire: pairs with the creator's release store of READY */
            if (atomic_load_explicit(&hd->ready, memory_order_acquire) == SHL_READY) {
                int r = validate_header(hd, len, max, why);
                if (r == SHL_OK)
                    r = validate_slots((const struct shl_slot *)(hd + 1), 0, *max, why);
                if (r != SHL_OK) {
                    if (r == SHL_ESIZE)
                        *expected = hd->total_size;
                    *size = len;
                    munmap(p, len);
                    return r;
                }
                *out = hd;
                *size = len;
                return SHL_OK;
            }
            int foreign = hd->magic != 0 && hd->magic != SHL_MAGIC;
            munmap(p, len);
            if (foreign)
                return SHL_EFOREIGN;
        }
        if (mono_ns() > give_up)
            return SHL_EINIT;
        struct timespec pause_ts = {0, 1000000};
        nanosleep(&pause_ts, NULL);
    }
}

/*
 * May this process use the existing segment behind st?  (docs/DESIGN.md,
 * "Trust model".)  Everyone who can write the segment can make this process
 * hang or crash, and through the robust-list pointers glibc keeps in a held
 * slot mutex, write to this process's memory.  So the segment must be owned
 * by our effective uid, or, by explicit opt-in, belong to `group`; and it
 * may grant other write only where `mode` does, group write only where
 * `mode` does or, on a segment we own, to its own group: only its owner (we)
 * or root can give a file its group and mode, so that grant is this user's
 * own opt-in (a lock made with group=).  Checked on the open file (fstat),
 * so a later rename cannot swap what was checked; only the owner (trusted
 * by these rules) or root can chmod/chown it afterwards.
 */
static int segment_trusted(const struct stat *st, uint32_t mode, int64_t group)
{
    int ours = st->st_uid == geteuid();
    int by_group = group >= 0 && (int64_t)st->st_gid == group;
    if (!ours && !by_group)
        return 0;
    /* With the opt-in, a group that may write must be that group. */
    if (group >= 0 && !by_group && (st->st_mode & 0020))
        return 0;
    uint32_t beyond = (uint32_t)st->st_mode & 0022u & ~mode;
    if (ours && group < 0)
        beyond &= ~0020u;     /* our own group grant */
    return beyond == 0;
}

static void fill_info(shl_open_info *info, const struct stat *st)
{
    info->uid = (uint32_t)st->st_uid;
    info->gid = (uint32_t)st->st_gid;
    info->mode = (uint32_t)st->st_mode & 07777u;
    info->dev = (uint64_t)st->st_dev;
    info->ino = (uint64_t)st->st_ino;
    info->size = (uint64_t)st->st_size;
}

/* Open "/pyshmlock.<name>" (path), creating it when `create` allows and
 * nobody has; *created says which.  Retries the race with an unlink between
 * our two opens.  Returns the fd, or -1 with errno set. */
static int open_name(const char *path, int create, uint32_t mode, int *created)
{
    int fd = -1;
    *created = 0;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        if (create) {
            fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode & 0777);
            if (fd >= 0) {
                *created = 1;
                return fd;
            }
            if (errno != EEXIST)
                return -1;
        }
        fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0 && (errno != ENOENT || !create))
            return -1;   /* ENOENT without create: FileNotFoundError */
        /* ENOENT with create: it was unlinked between our two opens; retry. */
    }
    return fd;
}

/* Give a segment we just created its group, mode and size, reserve its
 * space, map it and initialise it.  On failure the name is removed again,
 * so no partial segment is left.
 *
 * The space is reserved (posix_fallocate) before any byte is written: on a
 * full tmpfs a write through the mapping into an unbacked page would kill
 * the process with SIGBUS, while fallocate fails with ENOSPC. */
static int create_segment(int fd, const char *path, uint32_t mode, int64_t group,
                          uint32_t max, int fail_closed, struct shl_header **out,
                          size_t *size)
{
    int r = SHL_OK;
    *size = layout_size(max);
    /* The group first (fchown may clear mode bits), then the exact mode:
     * shm_open applied the umask, and `mode` is what the caller asked. */
    if ((group >= 0 && fchown(fd, (uid_t)-1, (gid_t)group) != 0) ||
        fchmod(fd, mode & 0777) != 0 || ftruncate(fd, (off_t)*size) != 0) {
        r = SHL_ESYS;
    } else if ((errno = posix_fallocate(fd, 0, (off_t)*size)) != 0) {
        r = SHL_ESYS;    /* ENOSPC: /dev/shm is full */
    } else {
        void *p = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            r = SHL_ESYS;
        } else {
            *out = p;
            init_segment(*out, max, fail_closed);
        }
    }
    if (r != SHL_OK) {
        int e = errno;
        shm_unlink(path);
        errno = e;
    }
    return r;
}

uint64_t shl_segment_size(uint32_t max_processes)
{
    if (max_processes < 1 || max_processes > SHL_MAX_PROCESSES_LIMIT)
        return 0;
    return layout_size(max_processes);
}

/* Check that an existing segment may be trusted, then map and validate it
 * (the untrusted-input boundary: nothing of it is read before this). */
static int open_existing(int fd, uint32_t mode, int64_t group, shl_open_info *info,
                         struct shl_header **out, size_t *size, uint32_t *max)
{
    struct stat st;
    uint64_t expected = 0;
    if (fstat(fd, &st) != 0)
        return SHL_ESYS;
    fill_info(info, &st);
    if (!segment_trusted(&st, mode, group))
        return SHL_EPERM;   /* never mapped: nothing of it reaches glibc */
    int r = map_existing(fd, out, size, max, &expected, &info->corrupt);
    if (r == SHL_ESIZE) {
        info->size = *size;
        info->expected_size = expected;
    }
    return r;
}

/*
 * A second open file description of the segment open on fd, never mapped:
 * the handle's liveness descriptor (liveness.c).  A mapping holds a
 * reference to the description it was made from, and a forked child
 * inherits mappings, so a liveness lock on the mapped description would
 * outlive this process in its children.  Reopened through /proc/self/fd
 * (exactly this file); without /proc, by name, checked to be the same file.
 * Returns the descriptor, or -1 with errno set.
 */
static int liveness_fd(int fd, const char *path, const struct stat *st)
{
    char self[40];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int lfd = open(self, O_RDWR | O_CLOEXEC);
    if (lfd < 0 && errno != ENOENT)
        return -1;
    if (lfd < 0)
        lfd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    struct stat now;
    if (lfd >= 0 && (fstat(lfd, &now) != 0 || now.st_dev != st->st_dev ||
                     now.st_ino != st->st_ino)) {
        close(lfd);
        lfd = -1;
        errno = ESTALE;   /* the name was given to another segment meanwhile */
    }
    return lfd;
}

/* Make the handle h (from handle_new, with its liveness descriptor) serve a
 * mapped, validated segment: take a slot, apply a lease that has already
 * passed, and publish it (handles.c); *out is its token. */
static int new_handle(shl_lock *h, struct shl_header *hd, size_t size, uint32_t max,
                      const struct stat *st, int no_slot, shl_lock **out)
{
    h->hdr = hd;
    h->slots = (struct shl_slot *)(hd + 1);
    h->map_size = size;
    h->max = max;
    h->dev = (uint64_t)st->st_dev;
    h->ino = (uint64_t)st->st_ino;
    h->no_slot = no_slot;
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    /* A segment whose host lease has already passed (its host's agent died
     * with every process) is paused before this open returns, so the caller
     * can admit nothing.  The handle is not published yet: no enter(). */
    lease_check(h);
    *out = handle_publish(h);
    wd_kick();
    return SHL_OK;
}

static int open_once(const char *name, const char *path, uint32_t flags, uint32_t mode,
                     int64_t group, uint32_t max_processes, shl_lock **out,
                     shl_open_info *info);

int shl_open(const char *name, uint32_t flags, uint32_t mode, int64_t group,
             uint32_t max_processes, shl_lock **out, shl_open_info *info)
{
    char path[SHL_PATH_MAX];
    int create = (flags & SHL_OPEN_CREATE) != 0;
    *out = NULL;
    memset(info, 0, sizeof *info);
    /* A mode must give the owner read and write: without them the
     * creator's own next open would be refused (EACCES). */
    if (!valid_name(name) || mode > 0777 || (mode & 0600) != 0600 ||
        group > (int64_t)UINT32_MAX - 1 ||
        (flags & ~(SHL_OPEN_CREATE | SHL_OPEN_FAIL_CLOSED | SHL_OPEN_NO_SLOT |
                   SHL_OPEN_NO_ROBUST | SHL_OPEN_SIZED)))
        return SHL_EINVAL;
    if ((create || (flags & SHL_OPEN_SIZED)) &&
        (max_processes < 1 || max_processes > SHL_MAX_PROCESSES_LIMIT))
        return SHL_EINVAL;
    core_init();
    /* Without robust futexes a dead holder is never reclaimed: only by
     * choice (the caller's flag), never silently.  An operator's handle
     * takes no slot: its own death leaves nothing to reclaim. */
    if (!(core_platform() & SHL_PLATFORM_ROBUST) &&
        !(flags & (SHL_OPEN_NO_ROBUST | SHL_OPEN_NO_SLOT)))
        return SHL_ENOROBUST;
    shl_segment_path(name, 0, path, sizeof path);

    for (int attempt = 0;; attempt++) {
        int r = open_once(name, path, flags, mode, group, max_processes, out, info);
        if (r == OPEN_AGAIN) {
            /* Re-created at another size, or removed, since we opened it
             * (recreate_unused): open what the name names now.  Each round
             * means another opener changed the name: bounded. */
            int replaced = info->replaced;
            memset(info, 0, sizeof *info);
            info->replaced = replaced;
            if (attempt < 64)
                continue;
            errno = EAGAIN;
            return SHL_ESYS;
        }
        if (r != SHL_EVERSION || !create || info->live != 0 || attempt >= 4)
            return r;
        /* An upgrade: the segment of another layout is unused (every
         * process of the old release stopped).  Remove exactly it and open
         * again (creating it anew); a segment someone replaced meanwhile is
         * looked at afresh. */
        struct stat old = {0};
        old.st_dev = (dev_t)info->dev;
        old.st_ino = (ino_t)info->ino;
        if (unlink_exactly(name, &old) < 0 && errno != ENOENT)
            return SHL_ESYS;
        memset(info, 0, sizeof *info);
        info->replaced = 1;
    }
}

/* One open: create the segment or open the existing one, and make the
 * handle.  On SHL_EVERSION, info names the other layout and its users. */
static int open_once(const char *name, const char *path, uint32_t flags, uint32_t mode,
                     int64_t group, uint32_t max_processes, shl_lock **out,
                     shl_open_info *info)
{
    int created, replaced = info->replaced;
    int fd = open_name(path, (flags & SHL_OPEN_CREATE) != 0, mode, &created);
    if (fd < 0)
        return SHL_ESYS;
    struct shl_header *hd = NULL;
    size_t size = 0;
    uint32_t max = max_processes;
    struct stat st;
    /* The handle and its liveness descriptor first, before a created
     * segment is initialised: an open that cannot have them (EMFILE)
     * leaves no segment behind.  The descriptor is opened and given to the
     * handle under the descriptors' mutex (handles.c: a fork meanwhile
     * closes it in the child). */
    shl_lock *h = handle_new();
    int r = h != NULL && fstat(fd, &st) == 0 ? SHL_OK : SHL_ESYS;
    if (r == SHL_OK) {
        snprintf(h->path, sizeof h->path, "%s", path);
        lfd_lock();
        h->lockfd = liveness_fd(fd, path, &st);
        if (h->lockfd < 0)
            r = SHL_ESYS;
        lfd_unlock();
    }
    if (r != SHL_OK && created) {
        int e = errno;
        shm_unlink(path);     /* empty, never marked ready: nobody uses it */
        errno = e;
    }
    if (r == SHL_OK)
        r = created ? create_segment(fd, path, mode, group, max_processes,
                                     (flags & SHL_OPEN_FAIL_CLOSED) != 0, &hd, &size)
                    : open_existing(fd, mode, group, info, &hd, &size, &max);
    if (r == SHL_EVERSION)
        info->live = (uint32_t)other_layout_users(fd, (size_t)info->size, &info->layout,
                                                  &info->live_pid);
    if (r == SHL_OK && fstat(fd, &st) != 0)
        r = SHL_ESYS;
    /* One more handle of the segment (liveness.c), and the segment still
     * the one the name names: else it was re-created meanwhile
     * (recreate_unused) or removed, and the caller opens again.  An opener
     * that asked for another size may re-create it here. */
    uint32_t want = !created && (flags & SHL_OPEN_SIZED) ? max_processes : 0;
    if (r == SHL_OK && want != 0 && want != max)
        r = recreate_unused(hd, max, h->lockfd, &st, name);
    else if (r == SHL_OK && liveness_share(h->lockfd) != 0)
        r = SHL_ESYS;
    if (r == SHL_OK && !names_segment(name, &st))
        r = OPEN_AGAIN;
    if (r == SHL_OK && want > max) {
        info->max_processes = max;   /* the segment stays, with fewer slots */
        r = SHL_EFULL;
    }
    int e = errno;
    close(fd);
    errno = e;
    if (r == SHL_OK) {
        fill_info(info, &st);
        info->created = created;
        info->replaced = replaced;
        info->max_processes = max;
        r = new_handle(h, hd, size, max, &st, (flags & SHL_OPEN_NO_SLOT) != 0, out);
    }
    if (r != SHL_OK) {
        e = errno;
        if (h != NULL)
            handle_discard(h);
        if (hd)
            munmap(hd, size);
        errno = e;
    }
    return r;
}

/* This process's slot in h, if the handle is attached in this process (not
 * a forked child's inherited one): -1 otherwise. */
static int32_t own_slot(shl_lock *h)
{
    int32_t self = self_slot(h);
    return self >= 0 && atomic_load_explicit(&h->fork_gen, memory_order_acquire) ==
                            atomic_load_explicit(&g_fork_gen, memory_order_relaxed)
               ? self : -1;
}

int shl_close_begin(shl_lock *token)
{
    shl_lock *h = handle_of(token);
    if (h == NULL)
        return SHL_ECLOSED;
    /* Take the handle from (its generation, 0 calls in flight) to H_CLOSING,
     * or refuse (see enter()).  acquire: every finished call's accesses to
     * the mapping happen before the checks and the munmap below. */
    uint64_t open = (uint64_t)token_gen(token) << 32;
    uint64_t n = open;
    if (!atomic_compare_exchange_strong_explicit(&h->inflight, &n, open | H_CLOSING,
                                                 memory_order_acquire, memory_order_relaxed))
        return (H_GEN(n) != token_gen(token) || (n & H_CLOSED)) ? SHL_ECLOSED
                                                                : SHL_EINFLIGHT;
    int32_t self = own_slot(h);
    int ours = self >= 0;
    int r = SHL_OK;
    if (ours && (atomic_load_explicit(&h->held_reads, memory_order_relaxed) != 0 ||
                 atomic_load_explicit(&h->gil_reads, memory_order_relaxed) != 0 ||
                 atomic_load_explicit(&h->held_excl, memory_order_relaxed) != 0)) {
        r = SHL_EBUSY;
    } else if (ours) {
        /* An attempt parked outside the core (asyncio) may still be queued
         * as an owed reader or claim the lock: freeing the slot would leave
         * a claim or registration that names a slot nobody owns. */
        struct shl_slot *me = &h->slots[self];
        if (owner_of(atomic_load_explicit(&h->hdr->state, memory_order_seq_cst)) ==
                (uint32_t)self + 1 ||
            atomic_load_explicit(&me->rwait[0], memory_order_seq_cst) != 0 ||
            atomic_load_explicit(&me->rwait[1], memory_order_seq_cst) != 0)
            r = SHL_EINFLIGHT;
    }
    if (r != SHL_OK) {
        /* open again (release: our loads above stay before any new call) */
        atomic_store_explicit(&h->inflight, open, memory_order_release);
        return r;
    }
    /* No call can be counted meanwhile (enter() waits while H_CLOSING is
     * set, and a failed enter() never changes the word). */
    atomic_store_explicit(&h->inflight, open | H_CLOSED, memory_order_release);
    return SHL_OK;
}

void shl_close_finish(shl_lock *token)
{
    shl_lock *h = handle_of(token);
    if (h == NULL || atomic_load_explicit(&h->inflight, memory_order_acquire) !=
                         (((uint64_t)token_gen(token) << 32) | H_CLOSED))
        return;       /* not a handle shl_close_begin just closed */
    int32_t self = own_slot(h);
    int ours = self >= 0;
    /* Off the open list before the slot is given up: this waits for a lease
     * watchdog sweep that may be looking at h (it may be taking a session's
     * ending in our slot's name, which must finish while the slot is ours:
     * a dead owner's recovery goes by that slot). */
    handle_unlist(h);
    if (ours) {
        struct shl_slot *me = &h->slots[self];
        atomic_store_explicit(&me->pid, 0, memory_order_relaxed);
        /* The liveness lock first: a prober that finds the mutex free then
         * finds the lock free too. */
        liveness_drop(h->lockfd, (uint32_t)self);
        keeper_call(KEEP_UNLOCK, &me->owner);
    }
    /* Off the open list, unmapped, recycled under a new generation: a
     * thread that loaded the token before close() and calls in later (cffi
     * drops the GIL before the C function runs) finds H_CLOSED or another
     * generation, never the lock the recycled handle serves next. */
    handle_recycle(h);
}

int shl_close(shl_lock *token)
{
    int r = shl_close_begin(token);
    if (r == SHL_OK)
        shl_close_finish(token);
    return r;
}

/* Count the live (or exiting) processes attached to the mapped segment
 * (dev/ino, open on fd), other than this process's own attachments;
 * reclaims dead ones. */
uint32_t count_others(struct shl_header *hd, uint32_t max, int fd, uint64_t dev, uint64_t ino)
{
    shl_lock probe;
    memset(&probe, 0, sizeof probe);
    probe.hdr = hd;
    probe.slots = (struct shl_slot *)(hd + 1);
    probe.max = max;
    atomic_store_explicit(&probe.self, -1, memory_order_relaxed);
    probe.lockfd = fd;
    uint32_t n = 0;
    for (uint32_t i = 0; i < max; i++) {
        /* Ours by attachment (a slot our keepers hold), never by pid: two
         * PID namespaces can both have a process with our pid. */
        if (own_attachment(dev, ino, i))
            continue;
        if (probe_slot(&probe, i))
            n++;
    }
    return n;
}

/*
 * Remove the name "/pyshmlock.<name>" only if it still names the segment
 * `probed` (dev/ino).  The name is renamed atomically to a private name,
 * which makes what it named ours to check: the same segment is unlinked;
 * another one (the lock was removed and created anew meanwhile) is renamed
 * back.  Returns 0 removed, 1 the name named another segment (look again),
 * or SHL_ESYS.
 *
 * Left: a process that creates the lock anew during the microseconds the
 * name is away ends up alone on a removed segment, as any creator racing an
 * unlink does.  A crash between the renames leaves a file
 * "/dev/shm/.pyshmlock-unlink.*" behind (and the lock's name missing).
 */
int unlink_exactly(const char *name, const struct stat *probed)
{
    static _Atomic uint32_t seq;   /* relaxed: only makes names unique in this process */
    char path[SHL_PATH_MAX], tmp[96];
    shl_segment_path(name, 1, path, sizeof path);
    int moved = -1;
    for (int k = 0; k < 8 && moved != 0; k++) {
        snprintf(tmp, sizeof tmp, SHM_FILE_DIR "/.pyshmlock-unlink.%d.%u.%llu", (int)getpid(),
                 atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed),
                 (unsigned long long)real_ns());
        moved = renameat2(AT_FDCWD, path, AT_FDCWD, tmp, RENAME_NOREPLACE);
        if (moved != 0 && (errno == EINVAL || errno == ENOSYS)) {
            /* No RENAME_NOREPLACE here: check the name, then remove it (a
             * window of a few instructions between the two is left). */
            struct stat cur;
            if (stat(path, &cur) != 0)
                return SHL_ESYS;
            if (cur.st_dev != probed->st_dev || cur.st_ino != probed->st_ino)
                return 1;
            return unlink(path) == 0 ? 0 : SHL_ESYS;
        }
        if (moved != 0 && errno != EEXIST)
            return SHL_ESYS;   /* ENOENT: removed meanwhile (FileNotFoundError) */
    }
    if (moved != 0)
        return SHL_ESYS;
    struct stat now;
    if (stat(tmp, &now) != 0)
        return SHL_ESYS;
    if (now.st_dev == probed->st_dev && now.st_ino == probed->st_ino)
        return unlink(tmp) == 0 ? 0 : SHL_ESYS;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return 1;
    if (errno != EEXIST)
        return SHL_ESYS;
    /* A creator found the name free while it was renamed away and made a
     * new lock: swap the segment we moved back in, then remove the new one.
     * Its creator is left alone on it, as any creator racing an unlink is. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) != 0 || unlink(tmp) != 0)
        return SHL_ESYS;
    return 1;
}

int shl_unlink(const char *name, int force, uint32_t *attached)
{
    char path[SHL_PATH_MAX];
    *attached = 0;
    if (!valid_name(name))
        return SHL_EINVAL;
    core_init();
    shl_segment_path(name, 0, path, sizeof path);
    if (force)   /* remove whatever the name names, without looking inside */
        return shm_unlink(path) == 0 ? SHL_OK : SHL_ESYS;
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0)
            return SHL_ESYS;
        struct stat st;
        struct shl_header *hd = NULL;
        size_t size = 0;
        uint32_t max = 0;
        uint64_t expected = 0;
        int r = SHL_OK;
        if (fstat(fd, &st) != 0)
            r = SHL_ESYS;
        else if (st.st_uid != geteuid())
            r = SHL_EPERM;   /* probing locks its mutexes: only our own segments */
        else
            r = map_existing(fd, &hd, &size, &max, &expected, NULL);
        uint32_t layout, pid;
        if (r == SHL_EVERSION) {
            /* Another release's lock: removed like ours when nobody uses it
             * (judged through the layout-independent prefix, layouts.c). */
            *attached = (uint32_t)other_layout_users(fd, (size_t)st.st_size, &layout, &pid);
            r = SHL_OK;
        }
        if (r == SHL_OK && hd) {
            *attached = count_others(hd, max, fd, (uint64_t)st.st_dev, (uint64_t)st.st_ino);
            munmap(hd, size);
        }
        int e = errno;
        close(fd);
        errno = e;
        if (r != SHL_OK)
            return r;
        if (*attached)
            return SHL_EBUSY;
        r = unlink_exactly(name, &st);
        if (r <= 0)
            return r;
        /* The name was given to another segment meanwhile: look at that one. */
    }
    errno = EAGAIN;
    return SHL_ESYS;
}
