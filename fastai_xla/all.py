"Everything a user needs: `from fastai_xla.all import *`."
from .backend import *
from .core import *
from .run import *
from .pickling import *
from .data import *
from .optimizer import *
from .callback import *
from .distributed import *
from .launch import *
from .checkpoint import *
from .precision import *
from .diagnostics import *
from .spmd import *
from .metrics import *
from .text import *
from .augment import *
from .models import *
