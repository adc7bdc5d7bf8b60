"""The application's own tables (Flask-SQLAlchemy): its teams, its people, who belongs where,
and its photos. Each team and person is mirrored in Space Jobs as an organization and a user,
with ids derived from the application's own (spacejobs.Tenancy.id_for): nothing to store, the
same id in every process. A file called models.py, beside `import spacejobs`: the one import
name keeps them apart."""

from __future__ import annotations

import uuid

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import ForeignKey, String, Uuid
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import spacejobs


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Team(db.Model):
    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))

    @property
    def organization_id(self) -> uuid.UUID:
        """The team's organization in Space Jobs."""
        return spacejobs.Tenancy.id_for("team", self.id)


class Person(db.Model):
    __tablename__ = "people"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(200), default="")

    @property
    def user_id(self) -> uuid.UUID:
        """The person's user in Space Jobs."""
        return spacejobs.Tenancy.id_for("person", self.id)


class Seat(db.Model):
    """A person's place in a team, with the role Space Jobs checks (owner, admin, member)."""

    __tablename__ = "seats"
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), primary_key=True)
    person_id: Mapped[int] = mapped_column(ForeignKey("people.id"), primary_key=True)
    role: Mapped[str] = mapped_column(String(10))


class Photo(db.Model):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    # Its team's organization, beside the team: the workers' row-level security on this table
    # admits the rows of the organization whose job they hold (see the guide's SQL).
    organization_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    title: Mapped[str] = mapped_column(String(200))
    width: Mapped[int]
    height: Mapped[int]
    thumbnail: Mapped[str | None] = mapped_column(String(200), default=None)


# -- the application's people and teams, and Space Jobs' mirror of them, in ONE transaction ----

def add_team(name: str) -> Team:
    team = Team(name=name)
    db.session.add(team)
    db.session.flush()  # its id
    spacejobs.Tenancy(db.session).put_organization(name, id=team.organization_id)
    return team


def add_person(email: str, name: str = "") -> Person:
    person = Person(email=email, name=name)
    db.session.add(person)
    db.session.flush()
    spacejobs.Tenancy(db.session).put_user(email, name=name, id=person.user_id)
    return person


def seat(team: Team, person: Person, role: str) -> None:
    db.session.merge(Seat(team_id=team.id, person_id=person.id, role=role))
    spacejobs.Tenancy(db.session).put_member(team.organization_id, person.user_id, role)


def unseat(team: Team, person: Person) -> None:
    """The person leaves the team: in the application and in Space Jobs, or in neither. Their
    queued jobs then fail requester_not_member when a worker takes them."""
    db.session.query(Seat).filter_by(team_id=team.id, person_id=person.id).delete()
    spacejobs.Tenancy(db.session).remove_member(team.organization_id, person.user_id)
