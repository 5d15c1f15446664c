"""Mock Canvas LMS: courses with assignments, due dates and the student's submissions.

State: courses by id, each with `Assignment`s (id, title, due date, points, description, and the
submission text and date once submitted). The status shown to the student is derived from the clock:
"submitted", "late" (submitted after the due date), "missing" (due date passed, nothing submitted)
or "open"; it is computed on read, so advancing the day never has to rewrite records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from envs.apps.base import ToolError, tool


@dataclass
class Assignment:
    id: str
    title: str
    due: str
    points: int
    description: str
    posted: str = ""
    submission: str | None = None
    submitted_on: str | None = None


@dataclass
class Course:
    id: str
    name: str
    assignments: dict[str, Assignment] = field(default_factory=dict)


@dataclass
class Canvas:
    courses: dict[str, Course] = field(default_factory=dict)
    today: str = ""

    def add_course(self, course_id: str, name: str) -> None:
        self.courses[course_id] = Course(course_id, name)

    def post(self, course_id: str, data: dict[str, Any]) -> None:
        a = Assignment(**data)
        assert a.id not in self.courses[course_id].assignments, f"duplicate assignment {a.id}"
        self.courses[course_id].assignments[a.id] = a

    def to_json(self) -> dict[str, Any]:
        return {
            "today": self.today,
            "courses": [
                {"id": c.id, "name": c.name,
                 "assignments": [asdict(a) for a in c.assignments.values()]}
                for c in self.courses.values()
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Canvas:
        cv = cls(today=data["today"])
        for c in data["courses"]:
            cv.add_course(c["id"], c["name"])
            for a in c["assignments"]:
                cv.post(c["id"], a)
        return cv

    def records(self) -> dict[str, dict[str, Any]]:
        return {
            f"canvas/assignments/{c.id}/{a.id}": asdict(a)
            for c in self.courses.values()
            for a in c.assignments.values()
        }

    def status(self, a: Assignment) -> str:
        if a.submitted_on is not None:
            return "late" if a.submitted_on > a.due else "submitted"
        return "missing" if self.today > a.due else "open"

    def _course(self, course_id: str) -> Course:
        if course_id not in self.courses:
            raise ToolError(f"canvas: no course {course_id!r}; canvas.list_courses shows them")
        return self.courses[course_id]

    def _assignment(self, course_id: str, assignment_id: str) -> Assignment:
        c = self._course(course_id)
        if assignment_id not in c.assignments:
            raise ToolError(f"canvas: course {course_id!r} has no assignment {assignment_id!r}")
        return c.assignments[assignment_id]

    # --- tools -----------------------------------------------------------------------------
    @tool("read")
    def list_courses(self) -> list[dict[str, Any]]:
        """List the courses the student is enrolled in."""
        return [{"id": c.id, "name": c.name} for c in self.courses.values()]

    @tool("read")
    def list_assignments(self, course_id: str, status: str | None = None) -> list[dict[str, Any]]:
        """List a course's assignments with due date and status (open, submitted, late, missing).

        Args:
            course_id: the course id
            status: only assignments with this status
        """
        c = self._course(course_id)
        out = []
        for a in sorted(c.assignments.values(), key=lambda a: (a.due, a.id)):
            st = self.status(a)
            if status is None or st == status:
                out.append({"id": a.id, "title": a.title, "due": a.due, "points": a.points, "status": st})
        return out

    @tool("read")
    def get_assignment(self, course_id: str, assignment_id: str) -> dict[str, Any]:
        """Return one assignment with its description and submission.

        Args:
            course_id: the course id
            assignment_id: the assignment id
        """
        a = self._assignment(course_id, assignment_id)
        return {**asdict(a), "status": self.status(a)}

    @tool("write")
    def submit(self, course_id: str, assignment_id: str, text: str) -> dict[str, Any]:
        """Submit (or resubmit) the text of an assignment.

        Args:
            course_id: the course id
            assignment_id: the assignment id
            text: the submission
        """
        a = self._assignment(course_id, assignment_id)
        if not text.strip():
            raise ToolError("canvas.submit: the submission text must not be empty")
        a.submission = text
        a.submitted_on = self.today
        return {"id": a.id, "status": self.status(a)}
