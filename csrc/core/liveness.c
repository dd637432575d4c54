/*
 * liveness.c - when a slot's process is gone: no thread of it can run
 * user code any more, so nothing it does can touch the lock or the data
 * the lock protects.  Only then may its holds be reclaimed (slots.c).
 *
 * What the kernel tells us, and when (Linux, kernel/exit.c do_exit()):
 *
 *  - The keeper's robust mutex (process.c) is marked FUTEX_OWNER_DIED when
 *    the *keeper thread* exits (exit_mm -> exit_robust_list, in that thread's
 *    own exit).  In a group exit (SIGKILL, exit(), a fatal signal) every
 *    thread exits on its own, so another thread may still run user code for
 *    a while after the keeper's death is visible; and a keeper that exits
 *    alone (a raw exit syscall) leaves the rest of the process running.  So
 *    the robust mutex is only the doorbell: it wakes a waiter at once, and
 *    the waiter then asks this file whether the whole process is gone.
 *  - The process's liveness lock: every attached process holds an OFD write
 *    lock on the byte of its slot index (F_OFD_SETLK on a descriptor of the
 *    segment that is not mapped, shl_lock.lockfd).  The kernel drops an OFD
 *    lock only when the last reference to its open file description goes:
 *    at the exit of the last thread that shares the file table, after every
 *    thread has released its address space (exit_mm comes before
 *    exit_files), or at close().  That is exact across PID namespaces and
 *    immune to PID reuse, but it comes after the whole address space is torn
 *    down (the last exit_mm's exit_mmap): a millisecond or two for a large
 *    Python process, as fcntl.flock's release.
 *  - Sooner, where we can see the process in /proc: every thread of it has
 *    PF_EXITING set.  do_exit() sets PF_EXITING (exit_signals) and the
 *    thread never returns to user mode after that; a process whose threads
 *    all have it can run no user code (and create no thread: a new thread is
 *    made by a running one).  Used only when the owner's PID and time
 *    namespaces are ours and our /proc shows our own PID namespace, with the
 *    owner's start time (recorded in its slot) guarding against PID reuse.
 *
 * A process whose keeper died and which still runs is "exiting": its slot
 * is neither reclaimed nor reused until it is gone (probe_slot).
 */
#include "internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#define PF_EXITING_FLAG 0x00000004u   /* include/linux/sched.h PF_EXITING */

/* ------------------------------------------------------ the liveness lock */

static int ofd_lock(int fd, short type, uint32_t byte, int cmd)
{
    /* l_pid must be 0 for the F_OFD_* commands (a GETLK answer sets it to
     * -1: never reuse the struct). */
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)byte,
                       .l_len = 1, .l_pid = 0};
    int r = fcntl(fd, cmd, &fl);
    if (cmd == F_OFD_GETLK && r == 0)
        return fl.l_type;
    return r;
}

/* Take this process's liveness lock on slot `slot` (see the head comment).
 * 0, or -1 with errno (EAGAIN/EACCES: some other open file description
 * still holds it: the previous owner is not gone, or a reader of the
 * segment holds a read lock there). */
int liveness_take(int fd, uint32_t slot)
{
    return ofd_lock(fd, F_WRLCK, slot, F_OFD_SETLK) == 0 ? 0 : -1;
}

void liveness_drop(int fd, uint32_t slot)
{
    (void)ofd_lock(fd, F_UNLCK, slot, F_OFD_SETLK);
}

/* Is slot `slot`'s liveness lock held (by an owner: a write lock)?  A read
 * lock there can only come from a reader of the segment, never from an
 * owner, and is ignored.  -1 if it cannot be asked (no descriptor). */
static int liveness_held(int fd, uint32_t slot)
{
    if (fd < 0)
        return -1;
    int t = ofd_lock(fd, F_WRLCK, slot, F_OFD_GETLK);
    if (t < 0)
        return -1;
    return t == F_WRLCK;
}

/* ------------------------------------------- an operator's liveness bytes */

/*
 * An operator's handle (SHL_OPEN_NO_SLOT: `pyshmlock resume`, `pyshmlock
 * session end`) owns no slot, so no slot's byte says whether it lives.
 * While it ends an update session (session.c) it holds an OFD write lock
 * on one of OP_BYTES bytes far above every slot's byte (locks may lie past
 * the end of a file), named in the session's token word; the kernel drops
 * it with the handle's descriptor (at close, at exit, at a kill), exactly
 * as a slot's.  Two threads of one process share the handle's open file
 * description, whose OFD locks do not conflict with each other, so the
 * handle's bitmap of bytes in use (h->op_bytes) keeps them apart.
 */
#define OP_BYTE_BASE (1u << 20)   /* far above SHL_MAX_PROCESSES_LIMIT: no slot's byte */
#define OP_BYTES 64

/* Take a free operator byte for h: its index, or -1 (every byte held:
 * by this process's other threads, or by other processes, or by a reader
 * of the segment that holds a read lock there). */
int liveness_take_operator(shl_lock *h)
{
    for (int k = 0; k < OP_BYTES; k++) {
        uint64_t bit = 1ULL << k;
        /* relaxed: a claim among this process's threads of which byte to
         * try; what other processes see is the OFD lock itself */
        if (atomic_fetch_or_explicit(&h->op_bytes, bit, memory_order_relaxed) & bit)
            continue;
        if (ofd_lock(h->lockfd, F_WRLCK, OP_BYTE_BASE + (uint32_t)k, F_OFD_SETLK) == 0)
            return k;
        /* relaxed: as above */
        atomic_fetch_and_explicit(&h->op_bytes, ~bit, memory_order_relaxed);
    }
    return -1;
}

/* Let operator byte k of h go (its ending is finished). */
void liveness_drop_operator(shl_lock *h, int k)
{
    (void)ofd_lock(h->lockfd, F_UNLCK, OP_BYTE_BASE + (uint32_t)k, F_OFD_SETLK);
    /* relaxed: as in liveness_take_operator */
    atomic_fetch_and_explicit(&h->op_bytes, ~(1ULL << k), memory_order_relaxed);
}

/* ------------------------------------------------ the segment's handles */

/*
 * Every handle of a segment, attached or an operator's, holds an OFD read
 * lock on SHARE_BYTE for its whole life, on its liveness descriptor (so the
 * kernel drops it with the handle: at close, exit or kill); a forked child's
 * handle takes one on its own description (handles.c).  An opener that
 * asks for another max_processes re-creates an unused segment only under
 * the write lock of that byte (segment.c, "Re-creating an unused segment"):
 * it gets it only while no other handle of the segment exists anywhere, and
 * while it holds it no opener can take a read lock, so none attaches to
 * the segment it removes.  An opener that mapped the segment before its
 * removal takes its read lock after it, finds the name naming another
 * segment, and opens again.
 */
#define SHARE_BYTE (OP_BYTE_BASE + OP_BYTES)

/* Take h's read lock on SHARE_BYTE, waiting (bounded, as for an unfinished
 * creation) while a re-creation holds the write lock.  0, or -1 with errno
 * (EAGAIN: a re-creation held it all that time). */
int liveness_share(int fd)
{
    int64_t give_up = mono_ns() + OPEN_WAIT_NS;
    while (ofd_lock(fd, F_RDLCK, SHARE_BYTE, F_OFD_SETLK) != 0) {
        if ((errno != EAGAIN && errno != EACCES) || mono_ns() > give_up)
            return -1;
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    return 0;
}

/* The same, one try, async-signal-safe (a forked child's handle). */
int liveness_share_now(int fd)
{
    return ofd_lock(fd, F_RDLCK, SHARE_BYTE, F_OFD_SETLK) == 0 ? 0 : -1;
}

/* Turn fd's read lock into the write lock: 0 if no other handle of the
 * segment exists (no other description holds the byte), else -1. */
int liveness_share_alone(int fd)
{
    return ofd_lock(fd, F_WRLCK, SHARE_BYTE, F_OFD_SETLK) == 0 ? 0 : -1;
}

/* And back to the read lock (never refused: nobody else holds the byte). */
void liveness_share_again(int fd)
{
    (void)ofd_lock(fd, F_RDLCK, SHARE_BYTE, F_OFD_SETLK);
}

/* Is operator byte k held by an operator (a write lock)?  1 yes, 0 no,
 * -1 cannot tell.  k comes from the segment: a byte no operator can hold
 * (k out of range) is free. */
int liveness_operator_held(int fd, uint32_t k)
{
    if (k >= OP_BYTES)
        return 0;
    return liveness_held(fd, OP_BYTE_BASE + k);
}

/* ------------------------------------------------------------------ /proc */

/* This process's view: the namespaces a slot's pid and start time are
 * comparable in, and whether our /proc shows our own PID namespace.  Read
 * once (namespaces do not change under a running process; a forked child
 * keeps its parent's). */
static pthread_once_t g_view_once = PTHREAD_ONCE_INIT;
static uint64_t g_pidns, g_timens;
static int g_proc_ours;

static uint64_t ns_inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Does our /proc show our own PID namespace?  /proc/self/status's NSpid
 * line lists our pid in every PID namespace from the one /proc was mounted
 * for down to ours: one number, and it is getpid(), only if that is ours.
 * (A /proc of an ancestor namespace names us by another pid, except by
 * chance: the same number can be our pid in both.)  Before Linux 4.1 (no
 * NSpid) /proc/self against getpid() is all there is. */
static int proc_is_ours(void)
{
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strstr(buf, "\nNSpid:");
    if (p != NULL) {
        char *end;
        unsigned long first = strtoul(p + 7, &end, 10);
        return end != p + 7 && (*end == '\n' || *end == 0) && first == (unsigned long)getpid();
    }
    char link[32];
    ssize_t k = readlink("/proc/self", link, sizeof link - 1);
    if (k <= 0)
        return 0;
    link[k] = 0;
    return strtoul(link, NULL, 10) == (unsigned long)getpid();
}

static void read_view(void)
{
    g_pidns = ns_inode("/proc/self/ns/pid");
    g_timens = ns_inode("/proc/self/ns/time");   /* 0 before Linux 5.6: no time namespaces */
    g_proc_ours = proc_is_ours();
}

uint64_t liveness_pidns(void)
{
    pthread_once(&g_view_once, read_view);
    return g_pidns;
}

uint64_t liveness_timens(void)
{
    pthread_once(&g_view_once, read_view);
    return g_timens;
}

/* Read /proc/<pid>[/task/<tid>]/stat: state, flags and start time.
 * Returns how many of the three it parsed, or -1 if the process or thread
 * is not there (any more). */
static int read_stat(const char *path, char *state, unsigned *flags, unsigned long long *start)
{
    char buf[1024];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? -1 : 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    int e = errno;
    close(fd);
    if (n <= 0)
        return n < 0 && e == ESRCH ? -1 : 0;
    buf[n] = 0;
    /* The command name may hold spaces and parentheses: the fields start
     * after the last ')'.  Then: state ppid pgrp session tty_nr tpgid flags
     * minflt cminflt majflt cmajflt utime stime cutime cstime priority nice
     * num_threads itrealvalue starttime (proc(5), fields 3-22). */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ')
        return 0;
    return sscanf(p + 2, "%c %*d %*d %*d %*d %*d %u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                         "%*d %llu", state, flags, start);
}

/* The start time of this process (clock ticks after boot, /proc/self/stat
 * field 22), recorded in its slot; 0 if /proc cannot tell. */
uint64_t liveness_start_ticks(void)
{
    char st;
    unsigned flags;
    unsigned long long start = 0;
    if (read_stat("/proc/self/stat", &st, &flags, &start) != 3)
        return 0;
    return start;
}

/* One pass over /proc/<pid>/task: 1 if every thread listed has PF_EXITING,
 * 0 if one has not, -1 if it cannot be read.  The tids seen go to tids[]
 * (up to cap; *n is the count, cap + 1 if there were more). */
static int task_pass(const char *dir, int *tids, int cap, int *n)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return errno == ENOENT ? 1 : -1;   /* reaped since: gone */
    int all = 1;
    *n = 0;
    struct dirent *e;
    while (all && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char path[96], st;
        unsigned flags = 0;
        unsigned long long start;
        if (strlen(e->d_name) > 20)
            continue;   /* not a tid */
        snprintf(path, sizeof path, "%.40s/%.20s/stat", dir, e->d_name);
        int k = read_stat(path, &st, &flags, &start);
        if (k < 0)
            continue;   /* released meanwhile */
        if (k < 2 || !(flags & PF_EXITING_FLAG))
            all = 0;
        if (*n < cap)
            tids[*n] = atoi(e->d_name);
        if (*n <= cap)
            (*n)++;
    }
    closedir(d);
    return all;
}

/* /proc has no entry for pid: is the process gone, or only hidden from us
 * (/proc mounted hidepid=2, "invisible": another user's processes are not
 * listed)?  kill() with no signal tells, whatever /proc shows: ESRCH is
 * gone; a process that is there but hidden cannot be judged from /proc. */
static int missing_means_gone(uint32_t pid)
{
    return kill((pid_t)pid, 0) < 0 && errno == ESRCH ? 1 : -1;
}

/*
 * Can the process (pid, start) still run user code, as our /proc tells it?
 * 1: gone (no such process, a different one under its pid, or every thread
 * exiting), 0: it may still run, -1: /proc cannot tell.
 *
 * Every thread is looked at twice.  A thread is created by a running one,
 * so a pass that saw every thread exiting can still have missed a thread
 * made after the listing passed (its creator then started to exit).  The
 * second pass lists again and must find no thread the first one did not
 * see, and every one exiting: each thread alive when the second listing
 * ended was created before it (so it is listed) and is exiting, so no
 * thread is left to run user code or to make another.
 */
static int proc_says_gone(uint32_t pid, uint64_t start)
{
    char path[64], st;
    unsigned flags;
    unsigned long long now_start = 0;
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int k = read_stat(path, &st, &flags, &now_start);
    if (k < 0)
        return missing_means_gone(pid);   /* reaped, or hidden from us */
    if (k < 3)
        return -1;
    if (now_start != start)
        return 1;               /* the pid was reused: the owner is gone */
    enum { CAP = 512 };
    int *a = malloc(2 * CAP * sizeof *a);
    if (a == NULL)
        return -1;
    int *b = a + CAP, na = 0, nb = 0;
    snprintf(path, sizeof path, "/proc/%u/task", pid);
    int r = task_pass(path, a, CAP, &na);
    if (r == 1 && na == 0)
        r = missing_means_gone(pid);      /* no task listed: reaped since, or hidden */
    if (r == 1 && na <= CAP)
        r = task_pass(path, b, CAP, &nb);
    if (r == 1) {
        if (na > CAP || nb > CAP)
            r = 0;              /* too many threads to compare: not proven */
        for (int i = 0; r == 1 && i < nb; i++) {
            int found = 0;
            for (int j = 0; j < na && !found; j++)
                found = a[j] == b[i];
            r = found;
        }
    }
    free(a);
    /* (Reaped between our reads and its pid given to a new process: the
     * passes then look at the new one, whose running threads say "not
     * gone", or whose exiting ones say "gone", true of ours too.) */
    return r;
}

/*
 * Is the process that owns slot i gone (see the head comment)?  Asked by a
 * prober that holds slot i's mutex (so no new owner can take the slot
 * meanwhile, and a liveness lock seen free stays free).  `fd` is any
 * descriptor of the segment (the observer's is read-only).
 */
int liveness_gone(int fd, const struct shl_slot *sl, uint32_t i)
{
    int held = liveness_held(fd, i);
    if (held == 0)
        return 1;
    uint32_t pid = atomic_load_explicit(&sl->pid, memory_order_relaxed);
    if (pid == 0)
        return held < 0;        /* nothing recorded: only the lock can tell */
    uint64_t start = atomic_load_explicit(&sl->start_ticks, memory_order_relaxed);
    pthread_once(&g_view_once, read_view);
    if (start == 0 || !g_proc_ours || g_pidns == 0 ||
        atomic_load_explicit(&sl->pidns, memory_order_relaxed) != g_pidns ||
        atomic_load_explicit(&sl->timens, memory_order_relaxed) != g_timens)
        return 0;               /* not ours to see in /proc: wait for the lock */
    return proc_says_gone(pid, start) == 1;
}
