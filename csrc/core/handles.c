/*
 * handles.c - this process's handles: the table that tokens index, each
 * handle's generation, the list of open handles, and recycling.
 *
 * A handle (struct shl_lock) is process-private: one attachment to one
 * segment.  Callers hold a token, not its address (internal.h, "handles"):
 * index + 1 and generation.  A closed handle goes on the free list and the
 * next open reuses it with the next generation, so what the process keeps
 * depends on the most locks open at once, not on how many were ever
 * opened, and a
 * late call through a token of a closed handle finds another generation
 * and gets SHL_ECLOSED.  The table grows in chunks of HANDLE_CHUNK handles
 * that are never freed: resolving any token is safe.
 *
 * g_handles_mu guards the two lists and the growth of the table.  It is a
 * leaf lock: nothing is called under it that takes another lock (the lease
 * watchdog's sweep runs its visit under it: a pause, a session expiry, both
 * atomic operations on the segment).  In a forked child the lists are
 * rebuilt from the table (handles_after_fork), whatever a thread of the
 * parent was doing with them.
 */
#include "internal.h"

#include <fcntl.h>

#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

_Atomic(shl_lock *) g_handle_chunks[HANDLE_CHUNKS];

static pthread_mutex_t g_handles_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_nchunks;            /* chunks allocated (under the mutex) */
static shl_lock g_open;               /* the open list's head (a ring) */
/* The free list, first in first out (through next): a process that opens
 * and closes one lock over and over cycles through a whole chunk's handles,
 * so each handle's generation advances HANDLE_CHUNK times slower. */
static shl_lock *g_free, *g_free_tail;
static uint32_t g_nopen;

/*
 * The liveness descriptors' mutex.  Held while a descriptor is opened and
 * given to a handle (segment.c), while a handle is published, and while a
 * closed or discarded handle's descriptor is closed; fork() takes it first
 * (pthread_atfork, process.c).  So a forked child finds every handle either
 * published (it reopens the descriptor, own_liveness_fd) or not, and then
 * any descriptor the handle has is one a thread of the parent was opening
 * or closing: the child closes it (that thread does not exist here, and the
 * descriptor would keep the parent's liveness lock for as long as the child
 * lives).  A leaf lock, held for a few system calls.
 */
static pthread_mutex_t g_lfd_mu = PTHREAD_MUTEX_INITIALIZER;

void lfd_lock(void)
{
    pthread_mutex_lock(&g_lfd_mu);
}

void lfd_unlock(void)
{
    pthread_mutex_unlock(&g_lfd_mu);
}

static void ring_init(void)
{
    if (g_open.next == NULL)
        g_open.next = g_open.prev = &g_open;
}

static void ring_insert(shl_lock *h)
{
    h->next = g_open.next;
    h->prev = &g_open;
    g_open.next->prev = h;
    g_open.next = h;
    g_nopen++;
}

static void ring_remove(shl_lock *h)
{
    h->prev->next = h->next;
    h->next->prev = h->prev;
    h->prev = h->next = NULL;
    g_nopen--;
}

static void free_push(shl_lock *h)
{
    h->next = NULL;
    if (g_free_tail)
        g_free_tail->next = h;
    else
        g_free = h;
    g_free_tail = h;
}

static shl_lock *free_pop(void)
{
    shl_lock *h = g_free;
    if (h) {
        g_free = h->next;
        if (g_free == NULL)
            g_free_tail = NULL;
    }
    return h;
}

/* A new chunk of closed handles of generation 0 (which no token names), on
 * the free list.  Caller holds the mutex.  0, or -1 (no memory, or table
 * full) with errno set. */
static int grow(void)
{
    if (g_nchunks >= HANDLE_CHUNKS) {
        errno = EMFILE;
        return -1;
    }
    shl_lock *c = calloc(HANDLE_CHUNK, sizeof *c);
    if (c == NULL) {
        errno = ENOMEM;
        return -1;
    }
    for (uint32_t i = 0; i < HANDLE_CHUNK; i++) {
        c[i].index = g_nchunks * HANDLE_CHUNK + i;
        c[i].lockfd = -1;   /* a forked child closes what an unpublished handle has */
        atomic_store_explicit(&c[i].inflight, H_CLOSED, memory_order_relaxed);
        free_push(&c[i]);
    }
    /* release: whoever resolves a token into this chunk sees it built. */
    atomic_store_explicit(&g_handle_chunks[g_nchunks], c, memory_order_release);
    g_nchunks++;
    return 0;
}

/* A free handle with every field but its in-flight word (still H_CLOSED, of
 * its last generation) and index cleared; NULL with errno set. */
shl_lock *handle_new(void)
{
    pthread_mutex_lock(&g_handles_mu);
    ring_init();
    shl_lock *h = NULL;
    if (g_free != NULL || grow() == 0)
        h = free_pop();
    pthread_mutex_unlock(&g_handles_mu);
    if (h == NULL)
        return NULL;
    /* A late caller may be reading h->inflight (it finds H_CLOSED): only the
     * fields before it are cleared here. */
    lfd_lock();   /* lockfd is never 0 (stdin) where a fork can see it */
    memset(h, 0, offsetof(struct shl_lock, inflight));
    h->lockfd = -1;
    lfd_unlock();
    h->prev = h->next = NULL;
    atomic_store_explicit(&h->self, -1, memory_order_relaxed);
    return h;
}

/* Open h under its next generation and put it on the open list; returns
 * the token that names it. */
shl_lock *handle_publish(shl_lock *h)
{
    uint32_t gen = H_GEN(atomic_load_explicit(&h->inflight, memory_order_relaxed)) + 1;
    if (gen == 0)
        gen = 1;          /* generation 0 names no handle */
    /* release: a call that resolves the token (acquire CAS) sees the
     * fields written before; the mutex publishes it to the watchdog.  Under
     * the descriptors' mutex: a fork sees it published or not (above). */
    lfd_lock();
    atomic_store_explicit(&h->inflight, (uint64_t)gen << 32, memory_order_release);
    lfd_unlock();
    pthread_mutex_lock(&g_handles_mu);
    ring_insert(h);
    pthread_mutex_unlock(&g_handles_mu);
    return (shl_lock *)(uintptr_t)(((uint64_t)gen << 32) | (h->index + 1));
}

/* h is H_CLOSED: take it off the open list.  The lock is the sweep's, so
 * this returns once no sweep looks at h, and none will again. */
void handle_unlist(shl_lock *h)
{
    pthread_mutex_lock(&g_handles_mu);
    ring_remove(h);
    pthread_mutex_unlock(&g_handles_mu);
}

/* h is closed and unlisted: unmap it and make it reusable. */
void handle_recycle(shl_lock *h)
{
    munmap(h->hdr, h->map_size);
    h->hdr = NULL;
    h->slots = NULL;
    atomic_store_explicit(&h->self, -1, memory_order_relaxed);
    lfd_lock();
    if (h->lockfd >= 0)
        close(h->lockfd);
    h->lockfd = -1;
    lfd_unlock();
    pthread_mutex_lock(&g_handles_mu);
    free_push(h);
    pthread_mutex_unlock(&g_handles_mu);
}

/* h came from handle_new and was never published (its mapping is the
 * caller's to undo). */
void handle_discard(shl_lock *h)
{
    lfd_lock();
    if (h->lockfd >= 0)
        close(h->lockfd);
    h->lockfd = -1;
    lfd_unlock();
    pthread_mutex_lock(&g_handles_mu);
    free_push(h);
    pthread_mutex_unlock(&g_handles_mu);
}

/* Call fn(h, arg) for every open handle, under the mutex (close waits to
 * take a handle off the list, so its mapping stays while fn runs).  Sets
 * *open to their number; returns the OR of what fn returned. */
int handles_sweep(handle_visit fn, void *arg, int *open)
{
    int r = 0;
    *open = 0;
    pthread_mutex_lock(&g_handles_mu);
    ring_init();
    for (shl_lock *h = g_open.next; h != &g_open; h = h->next) {
        if (atomic_load_explicit(&h->inflight, memory_order_acquire) & H_CLOSED)
            continue;      /* closed, about to be retired */
        (*open)++;
        r |= fn(h, arg);
    }
    pthread_mutex_unlock(&g_handles_mu);
    return r;
}

/*
 * A forked child's handle must not keep its parent's liveness descriptor:
 * an OFD lock lives as long as any descriptor of its open file description,
 * so the parent's death would go unnoticed while the child lives.  Give the
 * handle a new open file description of the same segment in the same
 * descriptor number (reopened through /proc/self/fd, which names the file
 * even if the lock's name was removed since).  Without /proc the inherited
 * descriptor is closed and the handle cannot attach in this child
 * (reattach: SHL_ESYS, ENOENT).  Async-signal-safe calls only.
 */
static void own_liveness_fd(shl_lock *h)
{
    if (h->lockfd < 0)
        return;
    char path[40] = "/proc/self/fd/";
    char digits[12];
    int n = 0;
    for (unsigned v = (unsigned)h->lockfd; n == 0 || v; v /= 10)
        digits[n++] = (char)('0' + v % 10);
    size_t at = strlen(path);
    while (n)
        path[at++] = digits[--n];
    path[at] = 0;
    int fresh = open(path, O_RDWR | O_CLOEXEC);
    /* The child's handle is one more handle of the segment (liveness.c,
     * "the segment's handles"): its parent's still holds the read lock, so
     * this one is never refused unless the parent closed it meanwhile. */
    if (fresh < 0 || liveness_share_now(fresh) != 0 || dup3(fresh, h->lockfd, O_CLOEXEC) < 0) {
        close(h->lockfd);
        h->lockfd = -1;
    }
    if (fresh >= 0)
        close(fresh);
}

/* A handle whose liveness descriptor a forked child could not reopen at the
 * fork (no descriptor free then, no /proc): open one by name, checked to be
 * the same segment.  SHL_OK, or SHL_ESYS with errno (EMFILE; ESTALE or
 * ENOENT once the name was removed or given to another segment). */
int liveness_reopen(shl_lock *h)
{
    int e = 0;
    lfd_lock();
    if (h->lockfd < 0) {
        int fd = shm_open(h->path, O_RDWR | O_CLOEXEC, 0);
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != h->dev ||
                        (uint64_t)st.st_ino != h->ino)) {
            close(fd);
            fd = -1;
            errno = ESTALE;
        }
        e = errno;
        h->lockfd = fd;
    }
    int ok = h->lockfd >= 0;
    lfd_unlock();
    errno = e;
    return ok ? SHL_OK : SHL_ESYS;
}

/*
 * In a forked child only the forking thread exists: the parent's threads
 * that were inside a call (their in-flight counts), deciding a close
 * (H_CLOSING), or using the lists are gone.  Counts and H_CLOSING are
 * dropped (closed stays closed), the lists rebuilt from the table, and each
 * open handle gets a liveness descriptor of its own.
 */
void handles_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_handles_mu = fresh;
    g_lfd_mu = fresh;      /* held by the forking thread (the prepare handler) */
    g_open.next = g_open.prev = &g_open;
    g_free = g_free_tail = NULL;
    g_nopen = 0;
    for (uint32_t k = 0; k < g_nchunks; k++) {
        shl_lock *c = atomic_load_explicit(&g_handle_chunks[k], memory_order_relaxed);
        for (uint32_t i = 0; c && i < HANDLE_CHUNK; i++) {
            uint64_t v = atomic_load_explicit(&c[i].inflight, memory_order_relaxed) &
                         ~(uint64_t)(H_COUNT | H_CLOSING);
            atomic_store_explicit(&c[i].inflight, v, memory_order_relaxed);
            /* relaxed (one thread here): the parent's threads that held
             * operator bytes do not exist in the child, whose handles get
             * descriptions of their own (own_liveness_fd) holding none */
            atomic_store_explicit(&c[i].op_bytes, 0, memory_order_relaxed);
            if (H_GEN(v) != 0 && !(v & H_CLOSED)) {
                own_liveness_fd(&c[i]);
                ring_insert(&c[i]);
            } else {
                /* Being opened or closed by a thread of the parent. */
                if (c[i].lockfd >= 0)
                    close(c[i].lockfd);
                c[i].lockfd = -1;
                free_push(&c[i]);
            }
        }
    }
}

void shl_handle_stats(uint32_t *open, uint32_t *allocated)
{
    pthread_mutex_lock(&g_handles_mu);
    *open = g_nopen;
    *allocated = g_nchunks * HANDLE_CHUNK;
    pthread_mutex_unlock(&g_handles_mu);
}
