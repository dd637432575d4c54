/*
 * process.c - this process's side of the core: the keeper threads that hold
 * its slot mutexes, attaching a handle to a slot (its liveness lock, the
 * slots' high-water mark), the platform check, and fork().
 *
 * Crash safety starts here.  Every process keeps its slot's robust mutex
 * locked from a small "keeper" thread that lives as long as the process
 * (holding it from an application thread would make the slot look dead when
 * that thread exits).  The kernel marks a robust mutex OWNER_DIED when the
 * thread that holds it exits, and wakes one waiter of its word: the keeper's
 * death rings the doorbell at once (wait.c sleeps on the mutex words of the
 * processes waited for).  It is the death of one thread, not of the
 * process: other threads of a process in a group exit run on for a while,
 * and a keeper that exits alone leaves its process running.  So a slot is
 * reclaimed only once liveness.c says the whole process is gone, which also
 * needs the liveness lock every attached process holds (attach_slot).
 *
 * Robust futexes are the kernel's (set_robust_list).  Where they are
 * missing (qemu-user returns ENOSYS) no death would ever be noticed: opening
 * refuses (SHL_ENOROBUST) unless the caller opts out of crash recovery.
 *
 * Everything in this file is process-private.  A forked child has only the
 * forking thread: after_fork_in_child resets every private mutex and the
 * in-flight counts of its handles, gives each handle a liveness descriptor
 * of its own, and bumps the fork generation, so each handle takes a slot of
 * its own on first use (reattach).
 */
#include "internal.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

/* --------------------------------------------------------- keeper threads */

/*
 * Keeper threads own this process's slot mutexes.  Requests reach them
 * through k_mu/k_cv; k_call_mu serialises callers so that one request is in
 * flight at a time.  All of it is process-private.
 *
 * Why more than one keeper: a robust mutex is found at its owner's death
 * through the owning thread's robust list, and the kernel walks at most
 * ROBUST_LIST_LIMIT (2048) entries of it (glibc adds at the head, so the
 * OLDEST slots would be lost: they would look alive forever).  So each
 * keeper holds at most KEEPER_CAPACITY mutexes, well below that limit, and
 * another keeper is started when every keeper is full.
 *
 * k_held records, for every mutex a keeper holds, which segment (dev/ino)
 * and slot it is.  That record, not a pid, is what "this process's
 * attachment" means: pids are not unique across PID namespaces.
 */
#define KEEPER_CAPACITY 1024     /* mutexes per keeper; the kernel walks 2048 */
#define KEEPER_MAX      256      /* keepers per process (262,144 attachments) */

struct kept {
    pthread_mutex_t *m;          /* the slot mutex, in our mapping */
    uint64_t dev, ino;           /* the segment */
    uint32_t slot, keeper;
};

static pthread_mutex_t k_call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t k_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t k_cv = PTHREAD_COND_INITIALIZER;   /* answers: callers wait */
/* Requests: keeper k waits on k_ask[k] alone.  A thread that exits while it
 * waits on a glibc condition variable leaves it unusable (a later
 * broadcast waits for that waiter to leave its group, for ever): a keeper
 * that exits alone must take only its own with it. */
static pthread_cond_t k_ask[KEEPER_MAX];
static int k_started, k_op, k_result;   /* k_started 0: no keeper (yet, or after fork) */
static uint64_t k_req, k_done;
static pthread_mutex_t *k_target;
static uint32_t k_who;                  /* the keeper the request is for */
static uint32_t k_nkeepers;             /* under k_call_mu, like all below */
static uint32_t k_count[KEEPER_MAX];    /* mutexes each keeper holds */
/* Each keeper's thread id (it writes its own, under k_mu, before it serves),
 * and whether it is known to have exited.  A keeper can exit alone (a raw
 * exit system call in that thread, a seccomp filter that kills a thread):
 * its requests would never be answered. */
static pid_t k_tid[KEEPER_MAX];
static int k_gone[KEEPER_MAX];
static struct kept *k_held;
static size_t k_nheld, k_capheld;
/* Serialises taking a slot (reattach).  Process-private too, so it
 * is reset in a forked child like the keeper's mutexes: a thread that held
 * it at fork() does not exist in the child. */
static pthread_mutex_t g_reattach_mu = PTHREAD_MUTEX_INITIALIZER;

_Atomic uint64_t g_fork_gen;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *keeper_main(void *arg)
{
    uint32_t me = (uint32_t)(uintptr_t)arg;
    /* Named for ps -L and debuggers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "pyshmlock-keep");
    pthread_mutex_lock(&k_mu);
    k_tid[me] = (pid_t)syscall(SYS_gettid);
    for (;;) {
        while (k_done == k_req || k_who != me)
            pthread_cond_wait(&k_ask[me], &k_mu);
        int r;
        if (k_op == KEEP_TRYLOCK) {
            r = pthread_mutex_trylock(k_target);
            /* The keeper is the owner now, so it must be the one that marks
             * the mutex consistent; the caller then reclaims the slot. */
            if (r == EOWNERDEAD)
                pthread_mutex_consistent(k_target);
        } else {
            r = pthread_mutex_unlock(k_target);
        }
        k_result = r;
        k_done = k_req;
        pthread_cond_broadcast(&k_cv);
    }
    return NULL;
}

/* Start keeper number k_nkeepers.  Caller holds k_call_mu and k_mu. */
static int start_keeper(void)
{
    if (k_nkeepers >= KEEPER_MAX)
        return EMFILE;
    pthread_t t;
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_cond_init(&k_ask[k_nkeepers], NULL);
    /* A keeper must never take a signal meant for the application. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&t, &attr, keeper_main, (void *)(uintptr_t)k_nkeepers);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (r == 0) {
        k_tid[k_nkeepers] = 0;
        k_gone[k_nkeepers] = 0;
        k_count[k_nkeepers++] = 0;
    }
    return r;
}

/* Has keeper `who` exited?  Asked when a request has waited KEEPER_ASK_NS
 * without an answer.  A thread id that no thread of this process has is
 * gone for good (a keeper not yet started has written no id: not gone).
 * Caller holds k_mu. */
#define KEEPER_ASK_NS (50LL * 1000 * 1000)
static int keeper_gone(uint32_t who)
{
    if (!k_gone[who] && k_tid[who] != 0 &&
        syscall(SYS_tgkill, getpid(), k_tid[who], 0) < 0 && errno == ESRCH) {
        k_gone[who] = 1;
        k_count[who] = KEEPER_CAPACITY;   /* never chosen again */
    }
    return k_gone[who];
}

/* Run one request on keeper `who`.  Caller holds k_call_mu and k_mu.
 * KEEPER_GONE if that keeper has exited (its request is dropped: the next
 * one overwrites it). */
#define KEEPER_GONE (-2)
static int keeper_run(uint32_t who, int op, pthread_mutex_t *m)
{
    k_op = op;
    k_target = m;
    k_who = who;
    uint64_t mine = ++k_req;
    pthread_cond_signal(&k_ask[who]);
    while (k_done != mine) {
        struct timespec ts;
        ns_to_timespec((int64_t)real_ns() + KEEPER_ASK_NS, &ts);   /* k_cv waits on CLOCK_REALTIME */
        if (pthread_cond_timedwait(&k_cv, &k_mu, &ts) == ETIMEDOUT && k_done != mine &&
            keeper_gone(who))
            return KEEPER_GONE;
    }
    return k_result;
}

/* KEEP_TRYLOCK: lock m from a keeper with room and record it as slot `slot`
 * of segment id (dev/ino).  KEEP_UNLOCK: unlock m from the keeper that holds
 * it.  Returns the pthread result, or -1 with errno set. */
static int keeper_request(int op, pthread_mutex_t *m, uint64_t dev, uint64_t ino,
                          uint32_t slot)
{
    int r;
    pthread_mutex_lock(&k_call_mu);
    pthread_mutex_lock(&k_mu);
    if (!k_started) {
        /* First use, or first use after fork(): the child has no keeper
         * and holds none of the parent's mutexes.  The table is dropped,
         * not reused: a fork in the middle of a realloc in another thread
         * may have left k_held pointing at freed memory (a leak of at most
         * one table per fork instead). */
        k_nkeepers = 0;
        k_nheld = 0;
        k_held = NULL;
        k_capheld = 0;
        k_started = 1;
    }
    if (op == KEEP_TRYLOCK) {
    again:;
        uint32_t who = 0;
        while (who < k_nkeepers && k_count[who] >= KEEPER_CAPACITY)
            who++;
        r = 0;
        if (who == k_nkeepers)
            r = start_keeper();
        if (r == 0 && k_nheld == k_capheld) {
            size_t cap = k_capheld ? 2 * k_capheld : 64;
            struct kept *p = realloc(k_held, cap * sizeof *p);
            if (p) {
                k_held = p;
                k_capheld = cap;
            } else {
                r = ENOMEM;
            }
        }
        if (r != 0) {
            errno = r;
            r = -1;
        } else {
            r = keeper_run(who, KEEP_TRYLOCK, m);
            if (r == KEEPER_GONE)
                goto again;      /* it never touched m: ask another keeper */
            if (r == 0 || r == EOWNERDEAD) {
                k_held[k_nheld++] = (struct kept){m, dev, ino, slot, who};
                k_count[who]++;
            }
        }
    } else {
        size_t i = 0;
        while (i < k_nheld && k_held[i].m != m)
            i++;
        if (i == k_nheld) {
            r = EPERM;    /* no keeper of ours holds it */
        } else {
            uint32_t who = k_held[i].keeper;
            r = k_gone[who] ? KEEPER_GONE : keeper_run(who, KEEP_UNLOCK, m);
            /* A keeper that exited left m marked OWNER_DIED (the kernel's
             * robust list): nothing of ours to unlock. */
            if (r == KEEPER_GONE)
                r = 0;
            else
                k_count[who]--;
            k_held[i] = k_held[--k_nheld];
        }
    }
    pthread_mutex_unlock(&k_mu);
    pthread_mutex_unlock(&k_call_mu);
    return r;
}

int keeper_call(int op, pthread_mutex_t *m)
{
    return keeper_request(op, m, 0, 0, 0);
}

/* Is slot `slot` of segment dev/ino held by a keeper of this process, i.e.
 * one of this process's own attachments? */
int own_attachment(uint64_t dev, uint64_t ino, uint32_t slot)
{
    int found = 0;
    pthread_mutex_lock(&k_call_mu);
    for (size_t i = 0; k_started && i < k_nheld && !found; i++)
        found = k_held[i].dev == dev && k_held[i].ino == ino && k_held[i].slot == slot;
    pthread_mutex_unlock(&k_call_mu);
    return found;
}

/* ------------------------------------------------------------ fork, attaching */

/* This process's start time (liveness.c), read once per process: a forked
 * child reads its own (g_start_pid tells whose it is). */
static uint64_t g_start_ticks;
static uint32_t g_start_pid;

static uint64_t start_ticks(uint32_t pid)
{
    if (g_start_pid != pid) {
        g_start_ticks = liveness_start_ticks();
        g_start_pid = pid;
    }
    return g_start_ticks;
}

/* In a forked child only the forking thread exists: no keeper, and every
 * process-private mutex of the core (k_call_mu, k_mu, k_cv, g_reattach_mu,
 * the watchdog's) may be held by a thread that is gone.  Start afresh;
 * handles notice the new fork generation and take a slot of their own. */
static void after_fork_in_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cv = PTHREAD_COND_INITIALIZER;
    k_call_mu = fresh;
    k_mu = fresh;
    k_cv = fresh_cv;
    g_reattach_mu = fresh;
    wd_after_fork();        /* the parent's watchdog is not here either */
    /* Before the lists are rebuilt: handles_after_fork gives each handle a
     * liveness descriptor of its own (the inherited one would keep the
     * parent's liveness locks alive for as long as this child lives). */
    k_started = 0;
    k_req = k_done = 0;
    /* The parent's threads that were inside a call (or deciding a close) do
     * not exist here: their in-flight counts would make close() refuse
     * forever.  Closed stays closed; the open list is rebuilt. */
    handles_after_fork();
    atomic_fetch_add_explicit(&g_fork_gen, 1, memory_order_relaxed);
}

/* What this platform offers (SHL_PLATFORM_*), read once per process. */
static uint32_t g_platform;

static uint32_t probe_platform(void)
{
    uint32_t p = 0;
    /* glibc registers every thread's robust list with set_robust_list at
     * its start; the kernel keeps it per thread.  get_robust_list reads it
     * back: ENOSYS (qemu-user refuses both calls) or no list registered
     * means a dead owner's mutex would never be marked OWNER_DIED. */
    void *head = NULL;
    size_t len = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &len) == 0 && head != NULL)
        p |= SHL_PLATFORM_ROBUST;
#ifdef SYS_futex_waitv
    /* futex_waitv with no words: EINVAL where it exists, ENOSYS before
     * Linux 5.16 (and under qemu-user). */
    const char *off = getenv("PYSHMLOCK_NO_FUTEX_WAITV");
    if (!(off && off[0] == '1') &&
        !(syscall(SYS_futex_waitv, NULL, 0u, 0u, NULL, CLOCK_MONOTONIC) < 0 && errno == ENOSYS))
        p |= SHL_PLATFORM_WAITV;
#endif
    return p;
}

static void init_once(void)
{
    g_platform = probe_platform();
    /* fork() waits while a thread opens, hands over or closes a liveness
     * descriptor (handles.c, "the liveness descriptors' mutex"). */
    pthread_atfork(lfd_lock, lfd_unlock, after_fork_in_child);
}

uint32_t core_platform(void)
{
    return g_platform;
}

uint32_t shl_platform(void)
{
    core_init();
    return g_platform;
}

/*
 * Raise the slots' high-water mark to cover slot i (a fetch-max by CAS).
 * attach_slot calls it once it owns slot i and before the slot can hold
 * anything of ours: before its pid is published and before any read or
 * owed registration in it (those need h->self, set after this).  See
 * scan_limit for why that order makes the bounded scans exact.
 *
 * When the mark already covers i no store is needed: the seq_cst load read
 * a value that an earlier raise (earlier in the single total order) wrote,
 * and the mark never falls, so every later seq_cst load of it sees at least
 * i + 1 just as if we had raised it ourselves.
 */
static void raise_slots_hwm(shl_lock *h, uint32_t i)
{
    uint32_t want = i + 1;
    uint32_t cur = atomic_load_explicit(&h->hdr->slots_hwm, memory_order_seq_cst);
    while (cur < want &&   /* [model:ATTACH_HWM] */
           !atomic_compare_exchange_weak_explicit(&h->hdr->slots_hwm, &cur, want,
                                                  memory_order_seq_cst, memory_order_seq_cst))
        ;
}

/* May slot i, whose mutex our keeper just took (r: 0 or EOWNERDEAD), be
 * ours?  Its last owner must be gone (liveness.c: a keeper that died with
 * its process still running leaves the slot to that process), and its
 * liveness lock free; what a dead owner left is reclaimed.  1 yes; 0 no
 * (the caller gives the mutex back). */
static int take_slot(shl_lock *h, uint32_t i, int r)
{
    struct shl_slot *sl = &h->slots[i];
    /* relaxed: we hold the slot's mutex; a claim naming it was made before
     * its owner died (the mutex orders it), or is corruption */
    int named = owner_of(atomic_load_explicit(&h->hdr->state, memory_order_relaxed)) == i + 1;
    /* (A free mutex with a pid: an exiting owner whose slot a prober gave
     * back; slots.c, probe_slot.) */
    if (r == EOWNERDEAD || named || !slot_is_clean(sl) ||
        atomic_load_explicit(&sl->pid, memory_order_relaxed) != 0) {
        if (!liveness_gone(h->lockfd, sl, i))
            return 0;           /* exiting: its holds stay until it is gone */
        recover_slot(h, i);
    }
    /* Free now; the lock is free too unless the last owner's exit has not
     * finished (liveness.c judged it gone from /proc) or a reader of the
     * segment holds a read lock there: another slot then. */
    return liveness_take(h->lockfd, i) == 0;
}

/* Take a free slot (or a dead process's, after reclaiming it). */
static int attach_slot(shl_lock *h)
{
    uint32_t pid = (uint32_t)getpid();   /* a forked child re-attaches: fresh pid */
    for (uint32_t i = 0; i < h->max; i++) {
        struct shl_slot *sl = &h->slots[i];
        if (!slot_mutex_sane(&sl->owner))
            return SHL_ECORRUPT;
        int r = keeper_request(KEEP_TRYLOCK, &sl->owner, h->dev, h->ino, i);
        if (r < 0)
            return SHL_ESYS;
        if (r != 0 && r != EOWNERDEAD)
            continue;    /* EBUSY: a live process owns it */
        if (!take_slot(h, i, r)) {
            keeper_request(KEEP_UNLOCK, &sl->owner, 0, 0, 0);
            continue;
        }
        raise_slots_hwm(h, i);
        h->pid = pid;
        /* Who we are, before anyone can probe the slot (our keeper holds
         * its mutex): liveness.c reads these. */
        atomic_store_explicit(&sl->pidns, liveness_pidns(), memory_order_relaxed);
        atomic_store_explicit(&sl->timens, liveness_timens(), memory_order_relaxed);
        atomic_store_explicit(&sl->start_ticks, start_ticks(pid), memory_order_relaxed);
        atomic_store_explicit(&sl->attached_at_ns, real_ns(), memory_order_relaxed);
        atomic_store_explicit(&sl->pid, pid, memory_order_relaxed);
        atomic_store_explicit(&h->self, (int32_t)i, memory_order_relaxed);   /* the watchdog reads it */
        atomic_store_explicit(&h->fork_gen, atomic_load_explicit(&g_fork_gen, memory_order_relaxed),
                              memory_order_release);
        return SHL_OK;
    }
    return SHL_EFULL;
}

/* ensure_attached's slow path (internal.h): first use after open, or the
 * first use of an inherited handle in a forked child, which holds nothing
 * and owns no slot. */
int reattach(shl_lock *h)
{
    if (h == NULL)
        return SHL_ECLOSED;   /* Python passes NULL once the object is closed */
    int r = SHL_OK;
    pthread_mutex_lock(&g_reattach_mu);
    if (atomic_load_explicit(&h->fork_gen, memory_order_acquire) !=
            atomic_load_explicit(&g_fork_gen, memory_order_relaxed) || self_slot(h) < 0) {
        atomic_store_explicit(&h->held_reads, 0, memory_order_relaxed);
        atomic_store_explicit(&h->gil_reads, 0, memory_order_relaxed);
        atomic_store_explicit(&h->held_excl, 0, memory_order_relaxed);
        atomic_store_explicit(&h->self, -1, memory_order_relaxed);
        /* An attached process always has a lease watchdog (a forked child
         * gets its own here): no watchdog, no attachment.  A forked child
         * whose handle could get no liveness descriptor of its own at the
         * fork (no descriptor free, no /proc) opens one now, by name. */
        r = liveness_reopen(h);
        if (r == SHL_OK)
            r = wd_start();
        if (r == SHL_OK)
            r = attach_slot(h);
        if (r == SHL_OK)
            wd_kick();   /* a child's inherited handles are already listed */
    }
    pthread_mutex_unlock(&g_reattach_mu);
    return r;
}

int shl_attach(shl_lock *h)
{
    RUN_IN_FLIGHT(h, ensure_attached(h));
}

void core_init(void)
{
    pthread_once(&g_once, init_once);
}
